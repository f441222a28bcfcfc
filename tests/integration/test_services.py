"""The loop every service runs in (`rota.services.run_loop`), as `rota reaper` and
`rota scheduler` run it: the answer deadline on its connection. A connection the
network silently stopped carrying (a TCP proxy started here stops forwarding it)
is taken for dead within the deadline, and the service goes on over a new one."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import rota
from rota import claim as claims
from rota import schedule_store
from rota.cli.services import Watched
from rota.db import errors_wrapped
from rota.deadlines import Deadlines
from rota.errors import DatabaseUnavailable
from rota.reaper import Reaper, ReaperSettings
from rota.schedule_store import ScheduleSpec
from rota.scheduler import Scheduler, SchedulerSettings
from rota.services import Service, ServiceLoop, run_loop
from rota.settings import ConnectionSettings
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _proxy

ANSWER = 1.0
"""The answer deadline of these tests, in seconds."""

TIMEOUTS = ConnectionSettings(
    answer_timeout_seconds=ANSWER,
    # Neither of these ends a wait on a connection nobody carries any more: the
    # proxy's end acknowledges every packet, and the server never sees the statement.
    statement_timeout_seconds=120,
    tcp_user_timeout_seconds=120,
)


@contextlib.contextmanager
def _looping(service: Service, dsn: str) -> Iterator[None]:
    """`run_loop(service)` in a thread, as `rota reaper` runs it, stopped at the end."""
    stop = threading.Event()
    thread = threading.Thread(
        target=run_loop, args=(service, dsn, stop), kwargs={"connection": TIMEOUTS}
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def _expire(conn: psycopg.Connection[Any], job_type: str) -> int:
    """A running job of `job_type` whose lease has run out."""
    job_id = rota.enqueue(conn, job_type)
    claims.claim(conn, "w", 1, 30, types=[job_type])
    conn.execute(
        "UPDATE rota.job SET locked_until = now() - interval '1 second' WHERE id = %s", (job_id,)
    )
    return job_id


def _status(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT status FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    return str(row["status"])  # type: ignore[index]


def test_a_reaper_whose_database_stops_answering_reconnects_within_the_deadline(
    conn: psycopg.Connection[Any], db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # No recovery grace: what is measured is how soon it reaps over a new connection.
    reaper = Reaper(ReaperSettings(interval_seconds=0.2, recovery_grace_seconds=0))
    with (
        caplog.at_level(logging.WARNING),
        _proxy(db_url) as (proxy, through),
        _looping(reaper, through),
    ):
        first = _expire(conn, "first")
        wait_for(lambda: _status(conn, first) == "ready", 20, "the first expired lease")
        proxy.freeze()  # the reaper's connection now carries nothing, silently
        second = _expire(conn, "second")
        expired_at = time.monotonic()
        wait_for(lambda: _status(conn, second) == "ready", 20, "the reaper over a new connection")
        waited = time.monotonic() - expired_at
    assert "no answer on a connection (rota-reaper)" in caplog.text
    # The next pass began within the interval; its wait ended at the deadline.
    assert waited < TIMEOUTS.statement_timeout_seconds / 4  # type: ignore[operator]


def test_a_scheduler_whose_database_stops_answering_reconnects_within_the_deadline(
    conn: psycopg.Connection[Any], db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute("UPDATE rota.schedule SET suspend = true")
    due = "UPDATE rota.schedule SET next_run_at = date_trunc('minute', now()) WHERE name = %s"
    jobs = "SELECT count(*) AS n FROM rota.job WHERE type = %s"
    scheduler = Scheduler(SchedulerSettings(poll_interval_seconds=0.5))
    with (
        caplog.at_level(logging.WARNING),
        _proxy(db_url) as (proxy, through),
        _looping(scheduler, through),
    ):
        schedule_store.upsert(conn, ScheduleSpec("before", "before", "* * * * *"))
        conn.execute(due, ("before",))
        wait_for(lambda: conn.execute(jobs, ("before",)).fetchone()["n"] == 1, 20, "a first slot")  # type: ignore[index]
        proxy.freeze()  # its NOTIFY and its next statement go nowhere now
        schedule_store.upsert(conn, ScheduleSpec("after", "after", "* * * * *"))
        conn.execute(due, ("after",))
        wait_for(
            lambda: conn.execute(jobs, ("after",)).fetchone()["n"] == 1,  # type: ignore[index]
            20,
            "the scheduler over a new connection",
        )
    assert "no answer on a connection (rota-scheduler)" in caplog.text


def test_each_answer_has_its_own_deadline_however_long_the_pass(db_url: str) -> None:
    # A pass of many statements may take longer than the deadline; only one
    # statement whose answer does not come in time ends it.
    deadlines = Deadlines(TIMEOUTS)
    with contextlib.closing(deadlines.connect(db_url, "rota-test", each_answer=True)) as conn:
        started = time.monotonic()
        for _ in range(4):
            conn.execute("SELECT pg_sleep(%s)", (ANSWER * 0.4,))
        assert time.monotonic() - started > ANSWER
        assert deadlines.severed == 0
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable), errors_wrapped():
            conn.execute("SELECT pg_sleep(30)")
        assert time.monotonic() - started < 10
        assert deadlines.severed == 1


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_after_failed_passes_the_reaper_leaves_expired_leases_to_their_workers_for_its_grace(
    conn: psycopg.Connection[Any], db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A lease that ran out while the database was away ran out for its worker
    # too: it could neither renew it nor write the outcome it holds. The reaper
    # gives the worker its recovery grace, counted from when passes work again.
    clock = Clock()
    reaper = Reaper(ReaperSettings(recovery_grace_seconds=30))
    loop = ServiceLoop(reaper, db_url, threading.Event(), Deadlines(TIMEOUTS), clock=clock)
    try:
        first = _expire(conn, "first")
        loop.step()
        assert _status(conn, first) == "ready"  # no failure seen: reaped at once

        # The database takes no writes (a failover's fenced primary, say).
        loop.connection().execute("SET default_transaction_read_only = on")
        second = _expire(conn, "second")
        loop.step()
        # Back: the next pass works, and starts the grace.
        clock.now = 100.0
        with caplog.at_level(logging.WARNING):
            loop.step()
        assert "full passes wait 30s" in caplog.text
        clock.now = 129.0
        loop.step()
        assert _status(conn, second) == "running"  # left to its worker
        clock.now = 130.0
        loop.step()
        assert _status(conn, second) == "ready"  # its worker did not come back

        # The connection ends under the reaper (a restart): the same again.
        pid = loop.connection().info.backend_pid
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        third = _expire(conn, "third")
        loop.step()
        clock.now = 200.0
        loop.step()
        clock.now = 229.0
        loop.step()
        assert _status(conn, third) == "running"
        clock.now = 230.0
        loop.step()
        assert _status(conn, third) == "ready"
    finally:
        loop.close()


def test_a_reaper_started_after_waiting_for_its_database_gives_the_grace_too(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    # `rota reaper` (and a worker) that had to wait for the database at start
    # starts as after failed passes: workers may hold leases through that outage.
    clock = Clock()
    reaper = Reaper(ReaperSettings(recovery_grace_seconds=30))
    loop = ServiceLoop(
        reaper, db_url, threading.Event(), Deadlines(TIMEOUTS), away=True, clock=clock
    )
    try:
        job_id = _expire(conn, "t")
        loop.step()
        assert _status(conn, job_id) == "running"
        clock.now = 30.0
        loop.step()
        assert _status(conn, job_id) == "ready"
    finally:
        loop.close()


def test_a_scheduler_is_not_ready_while_connecting_for_its_pass_fails(
    conn: psycopg.Connection[Any], db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # `rota scheduler --health-port`: after its wait for a NOTIFY found the
    # connection dead and closed it, each later pass fails while connecting,
    # before the scheduler's own pass begins; /readyz must say so.
    watched = Watched(Scheduler(SchedulerSettings(poll_interval_seconds=0.5)))
    ready = watched.pages()["/readyz"]
    loop = ServiceLoop(watched, db_url, threading.Event(), Deadlines(TIMEOUTS))
    allow = pgsql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}")
    database = pgsql.Identifier(conn.info.dbname)
    admin = psycopg.connect(make_conninfo(db_url, dbname="postgres"), autocommit=True)
    try:
        loop.step()
        assert ready()[0] == 200
        pid = loop.connection().info.backend_pid
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with caplog.at_level(logging.WARNING):
            loop.wait(5.0)  # the NOTIFY wait meets the end and closes the connection
        assert "waiting failed" in caplog.text
        admin.execute(allow.format(database, pgsql.SQL("false")))
        loop.step()
        assert ready()[0] == 503
    finally:
        admin.execute(allow.format(database, pgsql.SQL("true")))
        admin.close()
        loop.close()
