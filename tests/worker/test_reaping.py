"""The worker's reaper through a database outage longer than the lease: the
worker holds the outcome of a job that ended meanwhile, and its reaper, back
first, leaves the lease to it for the recovery grace, so the outcome is written
and the job runs once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import rota
from rota import claim as claims
from rota.jobs import Job
from rota.reaper import ReaperSettings
from rota.services import Phase
from rota.testing import EmbeddedPostgres
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _running, row

LEASE = 1.0


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own: stopping it must not disturb other tests."""
    with EmbeddedPostgres() as pg:
        yield pg


def _gated(fn: Callable[..., Any], gate: threading.Event) -> Callable[..., Any]:
    """`fn`, called once `gate` is open (its caller's thread waits meanwhile)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        assert gate.wait(60), "the gate stayed closed"
        return fn(*args, **kwargs)

    return call


def test_a_lease_that_ran_out_in_an_outage_is_left_to_its_worker_to_write_its_outcome(
    own_server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = own_server.url()
    rota.migrate(url)
    job_id = rota.enqueue(url, "t")
    runs: list[int] = []
    end = threading.Event()

    async def handler(job: Job) -> None:
        runs.append(job.id)
        await asyncio.get_running_loop().run_in_executor(None, end.wait)

    # The worker's writes (outcomes, heartbeats) wait at a gate: the test lets
    # them through only after the reaper's first pass since the restart, the
    # order in which a reaper with the shorter backoff comes back.
    gate = threading.Event()
    gate.set()
    for name in ("write_outcomes", "write_and_claim", "extend_leases"):
        monkeypatch.setattr(claims, name, _gated(getattr(claims, name), gate))
    reaper = ReaperSettings(interval_seconds=0.2)
    with _running(
        url,
        _async_handlers(t=handler),
        1,
        lease_seconds=LEASE,
        run_reaper=True,
        reaper=reaper,
        reconnect_max_seconds=0.5,
    ) as worker:
        wait_for(lambda: runs, 30, "the job to start")
        gate.clear()
        own_server.stop("fast")
        stopped_at = time.monotonic()
        end.set()  # the handler ends while the database is away: its outcome is held
        wait_for(lambda: worker.outcomes.unsettled, 30, "the outcome held")
        reaping = worker.reaping
        assert reaping is not None
        wait_for(lambda: reaping.recovery.phase is Phase.AWAY, 30, "a failed reaper pass")
        wait_for(lambda: time.monotonic() - stopped_at > 2 * LEASE, 30, "the lease to run out")
        rounds = reaping.rounds
        own_server.start()
        wait_for(lambda: reaping.rounds > rounds, 30, "a reaper pass after the restart")
        gate.set()
        with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:
            wait_for(lambda: row(conn, job_id)["status"] == "done", 30, "the job done")
            assert row(conn, job_id)["attempts"] == 1
            expired = conn.execute("SELECT coalesce(sum(count), 0) AS n FROM rota.lease_expiration")
            assert expired.fetchone() == {"n": 0}
    assert runs == [job_id]  # once: the outcome held through the outage was written
