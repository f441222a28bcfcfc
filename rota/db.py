"""Connections, and the edge where psycopg's errors become Rota's.

Everything that talks to PostgreSQL goes through `connection()` and
`errors_wrapped()`, so callers see `DatabaseUnavailable` (retry later: the
database is down or the connection broke) or `DatabaseError` (the statement was
refused), with psycopg's exception kept as ``__cause__``.
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


def is_unavailable(exc: BaseException) -> bool:
    """True for errors that mean "the database is not there right now"."""
    if isinstance(exc, DatabaseUnavailable):
        return True
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return True
    # The server going away mid-statement (admin shutdown, crash recovery), or
    # taking no writes for now: a primary fenced or demoted in a failover, a
    # standby reached through the URL (25006). Writes wait and try again, on a
    # new connection, as for a server that went away.
    return isinstance(
        exc,
        psycopg.errors.AdminShutdown
        | psycopg.errors.CrashShutdown
        | psycopg.errors.ReadOnlySqlTransaction,
    )


@contextlib.contextmanager
def errors_wrapped() -> Iterator[None]:
    """Turn psycopg errors raised inside the block into Rota's."""
    try:
        yield
    except psycopg.Error as exc:
        if is_unavailable(exc):
            raise DatabaseUnavailable(f"database unavailable: {exc}".strip()) from exc
        raise DatabaseError(f"{type(exc).__name__}: {exc}".strip()) from exc


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
