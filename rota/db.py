"""Connections, and the edge where psycopg's errors become Rota's.

Everything that talks to PostgreSQL goes through `connection()` (or
`aconnection()`) and `errors_wrapped()`, so callers see one of two kinds of error, with psycopg's
exception kept as ``__cause__``: `DatabaseUnavailable`, an outage (retry later
on a new connection: the database is down, the connection broke, the server
shut down or takes no writes), never counted as a job's attempt; or
`DatabaseError`, a refusal of the statement (a timeout, a deadlock, a value too
large), which counts as an attempt of the job it was for. Opening a connection
adds a third: `ConnectionOptionRefused`, an option libpq refuses before it asks
any server (`sslmode=bogus`), which is bad input and no outage: waiting never
mends it, so a long-running command says so at its start (`check_options`).

A caller may also hand over an ORM's connection: a SQLAlchemy `Connection` or
`Session` (`AsyncConnection` or `AsyncSession` for `aconnection()`) on the
psycopg driver, or a Django database connection on the psycopg 3 backend.
Rota then runs on the psycopg connection underneath, inside the ORM's open
transaction. Neither SQLAlchemy nor Django is imported unless such a
connection is given.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from psycopg import pq
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, timeout_from_conninfo
from psycopg.rows import dict_row

from rota.errors import ConnectionOptionRefused, DatabaseError, DatabaseUnavailable, InvalidInput
from rota.reading import make_tolerant, tolerant

Conn = psycopg.Connection[Any]
AConn = psycopg.AsyncConnection[Any]
ConnOrDsn = psycopg.Connection[Any] | str
"""A psycopg connection or a database URL (or an ORM's connection: see above)."""
AConnOrDsn = psycopg.AsyncConnection[Any] | str

APPLICATION_NAME = "rota"


OUTAGE_SQLSTATES = ("08", "57P", "25006", "53300")
"""SQLSTATEs (or their prefixes) of an outage: the connection failed (class 08),
the server went away under the statement (57P01 admin shutdown, 57P02 crash
shutdown, 57P03 cannot connect now), it takes no writes for now (25006: a primary
fenced or demoted in a failover, a standby reached through the URL), or it takes
no more connections (53300)."""


def is_unavailable(exc: BaseException) -> bool:
    """True for an outage: "the database is not there right now", never a job's fault.

    Everything else the server says is a refusal of the statement (its error
    kind is `DatabaseError`): a statement or lock timeout, a deadlock, a value or
    index row too large, a number out of range. A refusal is the statement's
    (and so its job's) business: it counts as an attempt; an outage never does.
    """
    if isinstance(exc, DatabaseUnavailable | psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        # libpq's own failures carry no SQLSTATE: refused, lost, timed out.
        return isinstance(exc, psycopg.OperationalError)
    return state.startswith(OUTAGE_SQLSTATES)


PASSING_SQLSTATES = ("40001", "40P01", "55P03", "55006", "57014", "53", "58030")
"""SQLSTATEs (or their prefixes) of a refusal that says nothing about the
statement, which the same statement may pass later: a serialization failure
(40001), a deadlock (40P01), a lock not had in time (55P03: lock_timeout),
an object in use (55006), a statement cancelled (57014: statement_timeout, or
somebody's pg_cancel_backend), the server short of resources (class 53: disk
full, out of memory), an I/O error (58030)."""


def is_passing(exc: BaseException) -> bool:
    """True for a refusal worth trying again as it is (`PASSING_SQLSTATES`), for a
    psycopg error or one of ours that wraps it."""
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    state = getattr(cause, "sqlstate", None)
    return isinstance(state, str) and state.startswith(PASSING_SQLSTATES)


class RefusedByDatabase(InvalidInput, DatabaseError):
    """A value the database's own checks refused (docs/limits.md).

    Both kinds at once: the caller who gave the value catches `InvalidInput`,
    as for Python's own checks; a loop that treats any refused statement as
    the statement's business (the worker's, the scheduler's) catches
    `DatabaseError`, as before the database checked."""


REFUSED_INPUT_SQLSTATE = "22023"
"""invalid_parameter_value: what the checks of migration 0024 (and rota.enqueue()
in SQL) raise for a value outside docs/limits.md, with the limit's reason."""


def refusal(exc: psycopg.Error) -> str:
    """The one-line reason of a value the database refused."""
    message = exc.diag.message_primary or str(exc)
    return message.splitlines()[0] if message else "the database refused a value"


@contextlib.contextmanager
def errors_wrapped() -> Iterator[None]:
    """Turn psycopg errors raised inside the block into Rota's."""
    try:
        yield
    except psycopg.Error as exc:
        if is_unavailable(exc):
            raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc
        if exc.sqlstate == REFUSED_INPUT_SQLSTATE:
            raise RefusedByDatabase(refusal(exc)) from exc
        raise DatabaseError(f"{type(exc).__name__}: {exc}".strip()) from exc
    except UnicodeEncodeError as exc:
        # A value that cannot even be sent (a lone surrogate): the statement is
        # refused before it leaves, as the server would refuse a NUL.
        raise DatabaseError(f"UnicodeEncodeError: {exc}") from exc
    except NotImplementedError as exc:
        # psycopg reads no time in a DateStyle but ISO, nor an interval in an
        # IntervalStyle but postgres: on a caller's connection set otherwise
        # (Rota's own connections are set back: `settle`).
        if "Style" not in str(exc):
            raise
        raise DatabaseError(
            f"{exc} (Rota reads times in ISO: SET DateStyle = ISO, IntervalStyle = postgres"
            " on the connection)"
        ) from exc


_REFUSED_OPTION = re.compile(
    r'invalid integer value .* for connection option "(?P<integer>\w+)"'
    r"|bad value for (?P<bad>\w+)|invalid (?P<invalid>\w+) value|invalid (?P<port>port) number"
    r"|could not parse network address|could not match \d+ (?:host names|port numbers)"
    r'|invalid connection option "(?P<unknown>\w+)"|invalid URI query parameter: "(?P<query>\w+)"'
    r'|missing "=" after|unterminated quoted string|invalid percent-encoded token'
)
"""How libpq (and psycopg before it) refuses a connection option's value, and
which option it names: the URL or a PG* variable is at fault, not the server,
which was not asked."""


def refused_option(exc: BaseException) -> ConnectionOptionRefused | None:
    """`exc` as the refusal of a connection option by libpq (or psycopg), or None.
    Judged from libpq's own failure only: an error with a SQLSTATE is the
    server's answer, so the options were taken."""
    if not isinstance(exc, psycopg.OperationalError | psycopg.ProgrammingError):
        return None
    if exc.sqlstate:
        return None
    text = str(exc)
    found = _REFUSED_OPTION.search(text)
    if not found:
        return None
    option = next((name for name in found.groups() if name), None)
    return ConnectionOptionRefused(" ".join(text[found.start() :].split()), option)


def _readable(dsn: str) -> None:
    """A connection string libpq can be given whole: a NUL would end it where libpq
    reads it (what follows silently left out), and a lone surrogate (what Python
    makes of bytes that are not UTF-8) cannot be sent at all."""
    if "\x00" in dsn:
        raise ConnectionOptionRefused("the connection string holds a NUL character")
    try:
        dsn.encode()
    except UnicodeEncodeError:
        raise ConnectionOptionRefused("the connection string is not valid UTF-8") from None


@contextlib.contextmanager
def _connecting(dsn: str | None = None) -> Iterator[None]:
    """Inside `errors_wrapped()`, where a connection to `dsn` is opened: options
    libpq refuses raise `ConnectionOptionRefused`, never an outage."""
    if dsn is not None:
        _readable(dsn)
    try:
        yield
    except psycopg.Error as exc:
        refused = refused_option(exc)
        if refused is None:
            raise
        raise refused from exc


CHECK_CONNECT_SECONDS = 5
"""The longest `check_options` waits for a server that does not answer (a host
that drops packets): psycopg's default, 130 s, would hold a command's start."""


def check_options(dsn: str) -> DatabaseUnavailable | DatabaseError | None:
    """Raise `ConnectionOptionRefused` if libpq refuses the connection options of
    `dsn` or of the PG* variables; else return what one connection attempt met
    (None: the server took it).

    Such a refusal comes before any server is asked, so one attempt tells. For a
    command whose first connection does not show it: one that serves before it
    connects (`rota exporter`, `rota web`, the operator), or whose connections
    carry options of their own in place of the URL's (`rota worker`'s timeouts).
    An outage is the caller's to wait for, as ever."""
    try:
        with errors_wrapped(), _connecting(dsn):
            # psycopg's reading of connect_timeout (refused if it is no number),
            # which the attempt below may shorten
            seconds = timeout_from_conninfo(conninfo_to_dict(dsn))
        connect(dsn, connect_timeout=min(seconds, CHECK_CONNECT_SECONDS)).close()
    except (DatabaseUnavailable, DatabaseError) as exc:
        return exc
    return None


_READ_AS_PSYCOPG_READS = {
    "DateStyle": ("ISO", "ISO"),
    "IntervalStyle": ("postgres", "postgres"),
    "client_encoding": ("UTF8", "UTF8"),
}
"""Per reported session setting: the value (its start) psycopg reads rows in, and
what to set where the session has another."""


def _unsettled(info: psycopg.ConnectionInfo) -> list[str]:
    return [
        f"SET {name} = {value}"
        for name, (start, value) in _READ_AS_PSYCOPG_READS.items()
        if not (info.parameter_status(name) or start).startswith(start)
    ]


def settle(conn: Conn) -> None:
    """Make one of Rota's own connections read rows as psycopg reads them: times
    in ISO (a `DateStyle` of German or SQL cannot be read), intervals in
    PostgreSQL's style, text in UTF-8 (SQL_ASCII gives bytes, LATIN1 cannot
    carry every name). A role's, a database's or PGOPTIONS' settings reach every
    session; the server reports them at connect, so a session that already
    reads right costs nothing."""
    fixes = _unsettled(conn.info)
    with errors_wrapped():
        for fix in fixes:
            conn.execute(fix)
        if fixes and not conn.autocommit:
            conn.commit()


async def asettle(conn: AConn) -> None:
    """`settle` for an async connection."""
    fixes = _unsettled(conn.info)
    with errors_wrapped():
        for fix in fixes:
            await conn.execute(fix)
        if fixes and not conn.autocommit:
            await conn.commit()


def connect(
    dsn: str,
    *,
    autocommit: bool = True,
    connection_class: type[Conn] = psycopg.Connection,
    **kwargs: Any,
) -> Conn:
    """Open a connection that returns rows as dicts (of `connection_class`, a
    psycopg `Connection` or a subclass); options libpq refuses raise
    `ConnectionOptionRefused`."""
    with errors_wrapped(), _connecting(dsn):
        conn: Conn = connection_class.connect(
            dsn,
            autocommit=autocommit,
            row_factory=dict_row,
            application_name=kwargs.pop("application_name", APPLICATION_NAME),
            **kwargs,
        )
    make_tolerant(conn.adapters)
    settle(conn)
    return conn


@contextlib.contextmanager
def connection(conn_or_dsn: ConnOrDsn) -> Iterator[Conn]:
    """Use the caller's connection as it is, or open (and close) one for a DSN.

    A caller's connection is never committed for it: enqueueing inside the
    caller's own transaction is how jobs and business rows commit together.
    """
    if isinstance(conn_or_dsn, psycopg.Connection):
        with errors_wrapped():
            yield conn_or_dsn
        return
    if not isinstance(conn_or_dsn, str):
        joined = _joined(conn_or_dsn)
        with errors_wrapped():
            yield joined
        return
    conn = connect(conn_or_dsn)
    try:
        with errors_wrapped():
            yield conn
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def aconnection(aconn_or_dsn: AConnOrDsn) -> AsyncIterator[AConn]:
    """`connection()` for asyncio: the caller's `AsyncConnection` as it is (never
    committed for it), or one opened (and closed) for a DSN."""
    if isinstance(aconn_or_dsn, psycopg.AsyncConnection):
        with errors_wrapped():
            yield aconn_or_dsn
        return
    if not isinstance(aconn_or_dsn, str):
        joined = await _ajoined(aconn_or_dsn)
        with errors_wrapped():
            yield joined
        return
    with errors_wrapped(), _connecting(aconn_or_dsn):
        conn: AConn = await psycopg.AsyncConnection.connect(
            aconn_or_dsn, autocommit=True, row_factory=dict_row, application_name=APPLICATION_NAME
        )
        make_tolerant(conn.adapters)
        await asettle(conn)
    try:
        with errors_wrapped():
            yield conn
    finally:
        await conn.close()


def fetch_all(conn: Conn, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run a statement and return its rows as dicts, whatever the connection's row
    factory and cursor class (a Django connection's client-side cursors cannot send
    binary parameters). A value Python cannot hold (a time of infinity, JSON nested
    too deep) comes back as its text (rota.reading), never as an error."""
    with errors_wrapped(), tolerant(psycopg.Cursor(conn, row_factory=dict_row)) as cur:
        cur.execute(sql, params)
        if cur.description is not None:
            return cur.fetchall()
        if conn.info.pipeline_status == pq.PipelineStatus.OFF:
            return []
        try:  # pipeline mode: a statement's results come with its first fetch
            return cur.fetchall()
        except psycopg.ProgrammingError:  # it returns no rows
            return []


async def afetch_all(
    conn: AConn, sql: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """`fetch_all()` on an `AsyncConnection`."""
    with errors_wrapped():
        async with tolerant(psycopg.AsyncCursor(conn, row_factory=dict_row)) as cur:
            await cur.execute(sql, params)
            if cur.description is not None:
                return await cur.fetchall()
            if conn.info.pipeline_status == pq.PipelineStatus.OFF:
                return []
            try:  # pipeline mode, as in fetch_all
                return await cur.fetchall()
            except psycopg.ProgrammingError:
                return []


_USE = (
    "give a psycopg 3 Connection, a SQLAlchemy Connection or Session, "
    "a Django database connection, or a database URL"
)
_USE_ASYNC = (
    "give a psycopg 3 AsyncConnection, a SQLAlchemy AsyncConnection or AsyncSession, "
    "or a database URL"
)
_SQLALCHEMY_FIX = "create the engine with a postgresql+psycopg:// URL (psycopg 3, sync or async)"


def _sqlalchemy_kind(obj: Any) -> str | None:
    """ "sync" or "async" for a SQLAlchemy Connection or Session of either kind,
    subclasses included (SQLModel's Session is one, defined outside
    SQLAlchemy's modules); None for anything else. SQLAlchemy is imported by
    the application that made such an object, never here first."""
    if "sqlalchemy.orm" not in sys.modules:
        return None
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session, scoped_session

    if isinstance(obj, Connection | Session | scoped_session):
        return "sync"
    if "sqlalchemy.ext.asyncio" in sys.modules:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(obj, AsyncConnection | AsyncSession):
            return "async"
    return None


def _is_django(obj: Any) -> bool:
    """A Django database connection: the `connection` proxy, or a backend's
    wrapper, its ENGINE's own subclass included (django-prometheus's,
    django-tenants')."""
    if type(obj).__module__.startswith("django.") and hasattr(obj, "ensure_connection"):
        return True
    if "django.db" not in sys.modules:
        return False
    from django.db.backends.base.base import BaseDatabaseWrapper

    return isinstance(obj, BaseDatabaseWrapper)


def _joined(obj: Any) -> Conn:
    """The psycopg connection under an ORM's connection, inside its open transaction."""
    kind = _sqlalchemy_kind(obj)
    if (
        isinstance(obj, psycopg.AsyncConnection)
        or kind == "async"
        or (kind is None and type(obj).__name__.startswith("Async"))
    ):
        raise InvalidInput(f"{type(obj).__name__} is asynchronous: use rota.enqueue_async")
    if kind == "sync" or type(obj).__module__.startswith("sqlalchemy."):
        return _sqlalchemy_joined(obj)
    if _is_django(obj):
        if obj.vendor != "postgresql":
            raise InvalidInput(f"Rota needs PostgreSQL; this Django connection is {obj.vendor}")
        obj.ensure_connection()
        if isinstance(obj.connection, psycopg.Connection):
            return obj.connection
        fix = "install psycopg 3 (Django's PostgreSQL backend uses it over psycopg2)"
        raise _not_psycopg3(obj.connection, "Django connection", fix)
    raise InvalidInput(f"Rota cannot use a {type(obj).__name__} as a connection: {_USE}")


def _sqlalchemy_joined(obj: Any) -> Conn:
    """The psycopg connection under a SQLAlchemy Connection or Session (or a
    scoped_session's current Session)."""
    from sqlalchemy.engine import Connection
    from sqlalchemy.exc import InvalidRequestError
    from sqlalchemy.orm import Session, scoped_session

    if isinstance(obj, scoped_session):  # Flask-SQLAlchemy's db.session, say
        obj = obj()  # the Session it stands for now
    if not isinstance(obj, Connection | Session):
        raise InvalidInput(
            f"Rota cannot use a SQLAlchemy {type(obj).__name__} as a connection: give a"
            " Connection (engine.connect()) or a Session, whose transaction it joins"
        )
    try:
        sa_conn = obj if isinstance(obj, Connection) else obj.connection()
        if not sa_conn.in_transaction():
            sa_conn.begin()  # as its first statement would: committed by its commit()
        raw = sa_conn.connection.driver_connection
    except InvalidRequestError as exc:  # closed, or a Session bound to no engine
        reason = str(exc).splitlines()[0]
        raise InvalidInput(
            f"Rota cannot use this SQLAlchemy {type(obj).__name__}: {reason}"
        ) from exc
    if isinstance(raw, psycopg.Connection):
        return raw
    raise _not_psycopg3(raw, "SQLAlchemy engine", _SQLALCHEMY_FIX)


async def _ajoined(obj: Any) -> AConn:
    """`_joined()` for asyncio: a SQLAlchemy AsyncConnection or AsyncSession."""
    name = type(obj).__name__
    kind = _sqlalchemy_kind(obj)
    if kind == "async":
        from sqlalchemy.exc import InvalidRequestError
        from sqlalchemy.ext.asyncio import AsyncSession

        try:
            sa_conn = await obj.connection() if isinstance(obj, AsyncSession) else obj
            if not sa_conn.in_transaction():
                await sa_conn.begin()
            raw = (await sa_conn.get_raw_connection()).driver_connection
        except InvalidRequestError as exc:  # closed, or a session bound to no engine
            reason = str(exc).splitlines()[0]
            raise InvalidInput(f"Rota cannot use this SQLAlchemy {name}: {reason}") from exc
        if isinstance(raw, psycopg.AsyncConnection):
            return raw
        raise _not_psycopg3(raw, "SQLAlchemy engine", _SQLALCHEMY_FIX)
    if (
        isinstance(obj, psycopg.Connection)
        or kind == "sync"
        or _is_django(obj)
        or (
            type(obj).__module__.split(".")[0] in ("sqlalchemy", "django")
            and not name.startswith("Async")
        )
    ):
        raise InvalidInput(f"{name} is synchronous: use rota.enqueue")
    raise InvalidInput(f"Rota cannot use a {name} as an async connection: {_USE_ASYNC}")


def _not_psycopg3(raw: Any, what: str, fix: str) -> InvalidInput:
    driver = type(raw).__module__.split(".")[0]
    return InvalidInput(
        f"Rota joins the transactions of psycopg 3 connections only; this {what} uses "
        f"{driver}: {fix}"
    )


def listen(conn: Conn, channel: str) -> None:
    """LISTEN on `channel` (an identifier, quoted as one)."""
    with errors_wrapped():
        conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
