"""Connections, and the edge where psycopg's errors become Rota's.

Everything that talks to PostgreSQL goes through `connection()` and
`errors_wrapped()`, so callers see one of two kinds of error, with psycopg's
exception kept as ``__cause__``: `DatabaseUnavailable`, an outage (retry later
on a new connection: the database is down, the connection broke, the server
shut down or takes no writes), never counted as a job's attempt; or
`DatabaseError`, a refusal of the statement (a timeout, a deadlock, a value too
large), which counts as an attempt of the job it was for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from rota.errors import DatabaseError, DatabaseUnavailable

Conn = psycopg.Connection[Any]
ConnOrDsn = psycopg.Connection[Any] | str

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


@contextlib.contextmanager
def errors_wrapped() -> Iterator[None]:
    """Turn psycopg errors raised inside the block into Rota's."""
    try:
        yield
    except psycopg.Error as exc:
        if is_unavailable(exc):
            raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc
        raise DatabaseError(f"{type(exc).__name__}: {exc}".strip()) from exc
    except UnicodeEncodeError as exc:
        # A value that cannot even be sent (a lone surrogate): the statement is
        # refused before it leaves, as the server would refuse a NUL.
        raise DatabaseError(f"UnicodeEncodeError: {exc}") from exc


def connect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> Conn:
    """Open a connection that returns rows as dicts."""
    with errors_wrapped():
        conn: Conn = psycopg.connect(
            dsn,
            autocommit=autocommit,
            row_factory=dict_row,
            application_name=kwargs.pop("application_name", APPLICATION_NAME),
            **kwargs,
        )
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
    conn = connect(conn_or_dsn)
    try:
        with errors_wrapped():
            yield conn
    finally:
        conn.close()


def fetch_all(conn: Conn, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run a statement and return its rows as dicts, whatever the connection's row factory."""
    with errors_wrapped(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def listen(conn: Conn, channel: str) -> None:
    """LISTEN on `channel` (an identifier, quoted as one)."""
    with errors_wrapped():
        conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
