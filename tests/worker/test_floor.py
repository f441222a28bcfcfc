"""A busy worker's claims start behind the jobs it claimed last (rota.floor.Floor);
a job that becomes ready behind that point still runs, found by the heartbeat
thread's probe, with the worker idle and its poll far away."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

import rota
from rota.jobs import Job
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _running, row


def test_a_job_ready_behind_where_the_claims_start_runs(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    ran: list[int] = []

    async def note(job: Job) -> None:
        ran.append(job.id)

    # Polling every minute: a job found only by the poll would miss the deadline.
    with _running(db_url, _async_handlers(note=note), 2, poll_interval_seconds=60) as worker:
        first = rota.enqueue(conn, "note")
        wait_for(lambda: row(conn, first)["status"] == "done", 20, "the first job to be done")
        wait_for(
            lambda: worker.claims.floor.bounds()[0][0] is not None, 20, "the claims to start late"
        )
        probes = worker.probe.rounds
        wait_for(lambda: worker.probe.rounds > probes, 20, "a probe after that")
        # An hour behind where the worker's claims now start (a job moved by
        # hand, a catch-up slot, a claim rolled back elsewhere).
        behind = rota.enqueue(conn, "note", run_at=row(conn, first)["run_at"] - timedelta(hours=1))
        wait_for(lambda: row(conn, behind)["status"] == "done", 20, "the job behind to be done")
    assert ran == [first, behind]


def test_a_limited_job_ready_behind_where_its_picks_start_runs(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    ran: list[int] = []

    async def note(job: Job) -> None:
        ran.append(job.id)

    rota.set_limit(conn, "note", concurrency=5)
    with _running(db_url, _async_handlers(note=note), 2, poll_interval_seconds=60) as worker:
        # The probe's first round, before the first claim, learns that "note" is limited.
        wait_for(lambda: worker.probe.rounds >= 1, 20, "the floor probe's first round")
        first = rota.enqueue(conn, "note")
        wait_for(lambda: row(conn, first)["status"] == "done", 20, "the first job to be done")
        wait_for(
            lambda: worker.claims.floor.bounds()[1].get("note", [None])[0] is not None,
            20,
            "the limited type's picks to start late",
        )
        probes = worker.probe.rounds
        wait_for(lambda: worker.probe.rounds > probes, 20, "a probe after that")
        behind = rota.enqueue(conn, "note", run_at=row(conn, first)["run_at"] - timedelta(hours=1))
        wait_for(lambda: row(conn, behind)["status"] == "done", 20, "the job behind to be done")
    assert ran == [first, behind]
