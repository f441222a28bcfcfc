"""The database goes away and comes back while workers run."""

from __future__ import annotations

from collections.abc import Iterator
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


def test_workers_survive_a_database_restart_and_count_no_attempt_for_it(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    url = own_server.url()
    rota.migrate(url)
    rota.enqueue_many(url, [rota.NewJob("slow", {"seconds": 0.05}) for _ in range(400)])
    workers = [
        WorkerProcess(url, "--concurrency", "4", log=tmp_path / f"w{i}.log") for i in range(2)
    ]
    try:
        wait_for(
            lambda: (done_count(url, "slow") or 0) >= 50, what="some jobs done before the outage"
        )
        own_server.stop("fast")
        # Workers keep running (and finishing handlers) while the database is away.
        assert all(w.proc.poll() is None for w in workers)
        own_server.start()
        wait_for(
            lambda: done_count(url, "slow") == 400,
            timeout=240,
            what="all jobs done after the outage",
        )
        assert all(w.proc.poll() is None for w in workers), "a worker died in the outage"
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
    # No attempt is counted for the outage, not even for the jobs of a claim the
    # database committed just before the connection broke (seen once, the machine
    # loaded): the worker gives those back when the database answers again.
    assert attempts == [(1, 400)]
    assert expirations == (0,)
    logs = "".join(w.output() for w in workers)
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
