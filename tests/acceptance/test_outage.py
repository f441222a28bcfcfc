"""The database goes away and comes back while workers run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import rota
from rota.testing import EmbeddedPostgres
from tests.acceptance.procs import WorkerProcess, wait_for


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own: stopping it must not disturb other tests."""
    with EmbeddedPostgres() as pg:
        yield pg


def done_count(url: str, job_type: str) -> int | None:
    """Done jobs of the test's own type: a fresh `rota migrate` also creates the
    built-in archive schedule, whose job may come due during any test."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FROM rota.job WHERE status = 'done' AND type = %s", (job_type,)
            ).fetchone()
            return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return None


def through_a_fault(
    url: str, jobs: int, fault: Callable[[list[WorkerProcess]], None], logs: Path
) -> str:
    """Two workers drain `jobs` slow jobs while `fault` happens to their database
    (it returns once the database is back). Every job ends done at its first
    attempt, no lease expires, no worker stops; returns the workers' logs."""
    rota.migrate(url)
    rota.enqueue_many(url, [rota.NewJob("slow", {"seconds": 0.05}) for _ in range(jobs)])
    workers = [WorkerProcess(url, "--concurrency", "4", log=logs / f"w{i}.log") for i in range(2)]
    try:
        wait_for(lambda: (done_count(url, "slow") or 0) >= jobs // 10, what="jobs done before")
        fault(workers)
        wait_for(lambda: done_count(url, "slow") == jobs, timeout=240, what="all jobs done")
        assert all(w.proc.poll() is None for w in workers), "a worker stopped in the fault"
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0]
    with psycopg.connect(url) as conn:
        attempts = conn.execute(
            "SELECT attempts, count(*) FROM rota.job WHERE type = 'slow' GROUP BY 1"
        ).fetchall()
        expirations = conn.execute(
            "SELECT coalesce(sum(count), 0) FROM rota.lease_expiration"
        ).fetchone()
    # No attempt is counted for the fault, not even for the jobs of a claim the
    # database committed just before the connection broke (seen once, the machine
    # loaded): the worker gives those back when the database answers again.
    assert attempts == [(1, jobs)]
    assert expirations == (0,)
    return "".join(w.output() for w in workers)


def test_workers_survive_a_database_restart_and_count_no_attempt_for_it(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    def restart(workers: list[WorkerProcess]) -> None:
        own_server.stop("fast")
        # Workers keep running (and finishing handlers) while the database is away.
        assert all(w.proc.poll() is None for w in workers)
        own_server.start()

    logs = through_a_fault(own_server.url(), 400, restart, tmp_path)
    assert "database" in logs  # the outage was noticed and reported


def test_a_worker_started_before_its_database_waits_for_it(tmp_path: Path) -> None:
    server = EmbeddedPostgres()  # created, not started yet
    try:
        url = server.url()
        worker = WorkerProcess(url, log=tmp_path / "early.log")
        try:
            wait_for(
                lambda: "waiting for the database" in worker.output(), what="the worker to wait"
            )
            assert worker.proc.poll() is None
            server.start()
            rota.migrate(url)
            rota.enqueue(url, "noop")
            wait_for(
                lambda: done_count(url, "noop") == 1, what="the job to run once the database is up"
            )
        finally:
            assert worker.stop() == 0
    finally:
        server.destroy()


def _set_read_only(url: str, on: bool) -> None:
    """Turn every session of the server read-only (as a fenced primary, or a standby
    behind the URL, is) or back; sessions already open follow at their next statement."""
    with psycopg.connect(
        url, autocommit=True, options="-c default_transaction_read_only=off"
    ) as conn:
        if on:
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        else:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
        conn.execute("SELECT pg_reload_conf()")


def test_a_database_that_turns_read_only_is_an_outage_not_a_refusal(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    """A server that takes no writes for a while (a primary fenced during a failover,
    a URL that reached a standby) refuses every claim, heartbeat and outcome with
    25006. Workers wait for it as for a database that went away: none stops, no
    completion is dropped, no attempt is counted."""
    url = own_server.url()

    def read_only(workers: list[WorkerProcess]) -> None:
        _set_read_only(url, True)
        try:
            wait_for(
                lambda: all("read-only transaction" in w.output() for w in workers),
                what="both workers to meet the read-only server",
            )
            assert all(w.proc.poll() is None for w in workers), "a worker stopped on read-only"
        finally:
            _set_read_only(url, False)

    logs = through_a_fault(url, 300, read_only, tmp_path)
    assert "refused a batch" not in logs  # outcomes waited; none was taken for a bad one
