"""Rota behind PgBouncer (Debian's 1.18), against the table in docs/operations.md
("Connection poolers"):

- transaction mode: a worker's registry refresh that gets another server
  connection than the one holding its presence lock goes on without it.

Skipped without the pgbouncer binary (`make install` installs Debian's package
when it may).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from rota import workers
from rota.deadlines import Deadlines
from rota.settings import ConnectionSettings
from tests import pgbouncer
from tests.conftest import Server
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.skipif(
    pgbouncer.BINARY is None, reason="pgbouncer not installed (Debian package pgbouncer)"
)

IGNORE_OPTIONS = {"ignore_startup_parameters": "options"}


@pytest.fixture
def bouncer(pg_server: Server, request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """A PgBouncer in the pool mode the test is parametrized with, ignoring startup options."""
    with PgBouncer(pg_server.admin_url, request.param, **IGNORE_OPTIONS) as running:
        yield running


def scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else next(iter(row.values()))


@pytest.mark.parametrize("bouncer", ["transaction"], indirect=True)
def test_a_registry_refresh_never_waits_for_the_presence_lock_another_server_holds(
    conn: psycopg.Connection[Any], bouncer: PgBouncer, db_url: str
) -> None:
    # The registration takes the worker's presence lock (a session advisory lock)
    # on the server connection its transaction got; the pool keeps it there. With
    # that server connection busy, the next refresh gets another one.
    info = workers.WorkerInfo("w-pooled", 1)
    registry = Deadlines(ConnectionSettings(answer_timeout_seconds=5)).connect(
        bouncer.url(db_url), "rota-worker-registry", each_answer=True
    )
    with registry, psycopg.connect(bouncer.url(db_url)) as busy:
        workers.register(registry, info)
        holder = scalar(conn, "SELECT pid FROM pg_locks WHERE locktype = 'advisory'")
        assert busy.execute("SELECT pg_backend_pid()").fetchone() == (holder,)  # in a transaction
        workers.refresh(registry, info)  # waited for ever (to the answer deadline) before
        assert scalar(conn, "SELECT count(*) FROM rota.worker WHERE seen_at > started_at") == 1
        busy.rollback()
