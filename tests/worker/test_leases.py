"""Lease renewal, the one path production takes (`LeaseRenewal.run_once`, stepped
here without its thread): leases extended, attempts whose lease is gone or whose
job somebody cancelled stopped, a refused renewal stopping nothing, a row locked
by someone holding back no other lease, /healthz after a lease without renewal,
and a job claimed again while its old attempt runs keeping its new lease."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import rota
from rota import claim as claims
from rota.deadlines import Deadlines
from rota.handlers import Handler
from rota.jobs import Job
from rota.reaper import Reaper
from rota.settings import ConnectionSettings
from rota_worker.attempts import Attempts, Event, Execution
from rota_worker.leases import LeaseRenewal
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.worker.helpers import row


def _renewal(url: str, attempts: Attempts, deadlines: Deadlines | None = None) -> LeaseRenewal:
    d = deadlines or Deadlines()
    connect = functools.partial(d.connect, url, "rota-worker-heartbeat", lock_timeout=True)
    return LeaseRenewal("w", attempts, connect, d.watch)


def _running(attempts: Attempts, job: Job) -> Execution:
    """`job` held and RUNNING, its handler a task that waits for ever."""
    record = attempts.claimed(job, None, 0.0)
    attempts.dispatch(record, Event.STARTED)
    record.task = asyncio.create_task(asyncio.sleep(3600))
    return record


async def _renew(renewal: LeaseRenewal) -> None:
    """One round of the renewal in a thread, as its own thread runs it; then the
    event loop applies what it found."""
    renewal.loop = asyncio.get_running_loop()
    await renewal.loop.run_in_executor(None, renewal.step)
    await asyncio.sleep(0)


def _seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def test_a_renewal_extends_held_leases_and_stops_lost_and_cancelled_ones(conn, db_url) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)])
    jobs = claims.claim(conn, "w", 10, 30)
    conn.execute("UPDATE rota.job SET locked_until = now() + interval '1 second'")
    attempts = Attempts(concurrency=3, lease_seconds=600)
    renewal = _renewal(db_url, attempts)

    async def scenario() -> dict[int, Execution]:
        records = {job.id: _running(attempts, job) for job in jobs}
        conn.execute("UPDATE rota.job SET locked_by = 'thief' WHERE id = %s", (ids[1],))
        rota.cancel(conn, [ids[2]])
        await _renew(renewal)
        tasks = [r.task for r in records.values() if r.task is not None]
        assert [t.done() or t.cancelling() > 0 for t in tasks] == [False, True, True]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return records

    try:
        records = asyncio.run(scenario())
    finally:
        renewal.close()
    assert [records[i].stopped for i in ids] == [None, Event.LEASE_LOST, Event.CANCEL]
    assert records[ids[1]].job.cancelled.is_set()
    assert row(conn, ids[0])["locked_until"] > row(conn, ids[0])["started_at"] + _seconds(500)
    assert len(attempts) == 3  # held until their outcomes are settled


def test_a_refused_renewal_stops_nothing_and_the_next_one_extends(conn, db_url) -> None:
    # The renewal's statement refused (its role has no grant on rota.job here): it
    # is logged, every attempt stays held and running, and the next round that is
    # let through extends the leases.
    role = f"{conn.info.dbname}_no_grants"  # roles are the server's: one per test database
    conn.execute(pgsql.SQL("CREATE ROLE {}").format(pgsql.Identifier(role)))
    rota.enqueue(conn, "t")
    (job,) = claims.claim(conn, "w", 1, 30)
    attempts = Attempts(concurrency=1, lease_seconds=600)
    refused = _renewal(make_conninfo(db_url, options=f"-c role={role}"), attempts)
    allowed = _renewal(db_url, attempts)

    async def scenario() -> Execution:
        record = _running(attempts, job)
        assert record.task is not None
        try:
            await _renew(refused)
            assert record.stopped is None and not record.task.done()
            claimed = row(conn, job.id)
            assert claimed["locked_until"] < claimed["started_at"] + _seconds(60)  # not extended
            await _renew(allowed)
        finally:
            record.task.cancel()
            await asyncio.gather(record.task, return_exceptions=True)
        return record

    try:
        record = asyncio.run(scenario())
    finally:
        refused.close()
        allowed.close()
        conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
    assert record.stopped is None
    assert row(conn, job.id)["locked_until"] > row(conn, job.id)["started_at"] + _seconds(500)


def test_a_lease_row_locked_by_someone_holds_back_no_other_lease(conn, db_url) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t"), rota.NewJob("t")])
    jobs = claims.claim(conn, "w", 2, 30)
    attempts = Attempts(concurrency=2, lease_seconds=600)
    for job in jobs:
        attempts.claimed(job, None, 0.0)
    deadlines = Deadlines(ConnectionSettings(lock_timeout_seconds=0.2))
    renewal = _renewal(db_url, attempts, deadlines)
    with psycopg.connect(db_url) as other:  # a transaction holding the first row's lock
        other.execute("SELECT * FROM rota.job WHERE id = %s FOR UPDATE", (ids[0],))
        leases, unknown = renewal._extend({(j.id, j.attempts) for j in jobs})
        other.rollback()
    renewal.close()
    assert [lease.job_id for lease in leases] == [ids[1]]
    assert unknown == {(ids[0], 1)}  # not renewed this time, and not taken for lost
    assert row(conn, ids[1])["locked_until"] > row(conn, ids[0])["locked_until"]


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_healthz_fails_when_the_heartbeat_stops_trying_not_while_the_database_is_away(
    conn, db_url
) -> None:
    # Liveness is for a stuck worker: an outage, however long, is readiness's
    # business (restarting the worker would throw away the outcomes it holds).
    rota.enqueue(conn, "t")
    (job,) = claims.claim(conn, "w", 1, 30)
    attempts = Attempts(concurrency=1, lease_seconds=30)
    clock = Clock()
    d = Deadlines()
    away = make_conninfo(db_url, port=_closed_port())
    connect = functools.partial(d.connect, away, "rota-worker-heartbeat", lock_timeout=True)
    renewal = LeaseRenewal(
        "w", attempts, connect, d.watch, reconnect_max_seconds=10, answer_seconds=40, clock=clock
    )
    attempts.claimed(job, None, 0.0)
    for _ in range(10):  # the database refuses connections for 10 minutes
        clock.now += 60
        renewal.step()
        assert renewal.overdue() is None
    # A round may take the answer deadline, and the next come a backoff step
    # later: the heartbeat is stuck only past a lease, a backoff and a deadline.
    clock.now += 30 + 10 + 40 - 1
    assert renewal.overdue() is None
    clock.now += 1
    assert "heartbeat stuck: no round ended for 80s" in (renewal.overdue() or "")
    renewal.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_slots(db_url: str, handler: Handler) -> tuple[Worker, threading.Thread]:
    """A worker of two slots and a short lease, no reaper of its own (the test
    reaps), running `handler` for type sticky in a thread."""
    settings = WorkerSettings(
        concurrency=2, lease_seconds=3, run_reaper=False, run_scheduler=False,
        poll_interval_seconds=0.2,
    )  # fmt: skip
    worker = Worker(db_url, settings, handlers={"sticky": handler})
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    return worker, thread


def test_a_job_claimed_again_while_its_old_attempt_runs_keeps_its_new_lease(conn, db_url) -> None:
    """The sequence that once let a third run overlap the second: one worker, its
    attempt 1 reaped while still running, the same worker claims attempt 2."""
    job_id = rota.enqueue(conn, "sticky")
    release = {1: threading.Event(), 2: threading.Event()}
    started: list[int] = []

    def sticky(job: Job) -> None:
        started.append(job.attempts)
        release[job.attempts].wait(60)  # ignores job.cancelled on purpose

    worker, thread = _two_slots(
        db_url, Handler("sticky", sticky, is_async=False, wants_context=False)
    )
    try:
        wait_for(lambda: started == [1], what="attempt 1 to start")
        conn.execute("UPDATE rota.job SET locked_until = now() - interval '1 second'")
        assert Reaper().run_once(conn).requeued == [job_id]
        # The renewal finds attempt 1's lease gone and stops it (its thread runs on,
        # keeping its slot: the second slot takes attempt 2 in the same worker).
        wait_for(lambda: started == [1, 2], what="attempt 2 to start in the same worker")
        assert row(conn, job_id)["locked_by"] == worker.worker_id
        release[1].set()  # attempt 1's thread returns late: it must not disturb attempt 2
        seen: list[Any] = []

        def renewed_twice() -> bool:
            until = row(conn, job_id)["locked_until"]
            if not seen or until > seen[-1]:
                seen.append(until)
            return len(seen) >= 3

        wait_for(renewed_twice, what="attempt 2's lease to be renewed twice")
        assert [e.key for e in worker.attempts.running] == [(job_id, 2)]
        release[2].set()
        wait_for(lambda: row(conn, job_id)["status"] == "done", what="the job to be done")
        assert (row(conn, job_id)["attempts"], started) == (2, [1, 2])
    finally:
        release[1].set()
        release[2].set()
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_run_given_back_uncounted_and_claimed_again_does_not_end_its_new_run(
    conn, db_url
) -> None:
    """The same shape with a step stored first: the reaper gives the attempt back
    uncounted, so the same worker's next claim is attempt 1 again. The old run's
    late return must not end the job under the new run's lease."""
    job_id = rota.enqueue(conn, "sticky")
    release = [threading.Event(), threading.Event()]
    started: list[int] = []

    def sticky(job: Job, ctx: rota.Context) -> dict[str, int]:
        run = len(started)
        started.append(job.attempts)
        ctx.step(f"s{run}", lambda: run)
        release[run].wait(60)  # ignores job.cancelled on purpose
        return {"run": run}

    worker, thread = _two_slots(
        db_url, Handler("sticky", sticky, is_async=False, wants_context=True)
    )
    try:
        steps = "SELECT count(*) AS n FROM rota.job_step"
        wait_for(lambda: conn.execute(steps).fetchone()["n"] == 1, what="the first run's step")
        conn.execute("UPDATE rota.job SET locked_until = now() - interval '1 second'")
        assert Reaper().run_once(conn).requeued == [job_id]
        wait_for(lambda: started == [1, 1], what="a second run at attempt 1 in the same worker")
        release[0].set()  # the old run returns late
        wait_for(lambda: conn.execute(steps).fetchone()["n"] == 2, what="the new run's step")
        wait_for(lambda: worker.attempts.running == [] or all(
            e.key == (job_id, 2) for e in worker.attempts.running
        ), what="the old run to be settled")  # fmt: skip
        assert row(conn, job_id)["status"] == "running"
        release[1].set()
        wait_for(lambda: row(conn, job_id)["status"] == "done", what="the job to be done")
        assert rota.result(conn, job_id) == (rota.Status.DONE, {"run": 1})
    finally:
        release[0].set()
        release[1].set()
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
