"""The worker's parts in-process, against a real database: the outcome buffer,
the lease keeper, and the bookkeeping of a job claimed again while an earlier
attempt of it still runs."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import rota
from rota import claim as claims
from rota.claim import Attempt
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.handlers import Handler
from rota.jobs import Job, Outcome
from rota.reaper import Reaper
from rota_worker.execute import Execution, Stop
from rota_worker.leases import LeaseKeeper
from rota_worker.link import Link
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for


@pytest.fixture
def io() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown(wait=True)


def row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    found = conn.execute("SELECT * FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return dict(found)


def test_the_buffer_writes_a_batch_and_tells_lost_from_self_completed(conn, db_url, io) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(4)])
    jobs = {j.id: j for j in claims.claim(conn, "w", 10, 30)}
    conn.execute("UPDATE rota.job SET locked_by = 'thief' WHERE id = %s", (ids[2],))
    with psycopg.connect(db_url, autocommit=True) as own:
        assert rota.complete(own, jobs[ids[3]])  # done in the handler's own transaction
    settled: list[Attempt] = []
    buffer = OutcomeBuffer("w", batch_size=3, settled=settled.append)
    outcomes = [Outcome.DONE, Outcome.RETRY, Outcome.DONE, Outcome.DONE]
    for job_id, outcome in zip(ids, outcomes, strict=True):
        buffer.add(Attempt(job_id, 1, outcome, delay=60, error="boom", type="t"))

    async def flush_all() -> None:
        link = Link(db_url, "flush", io)
        try:
            while buffer.pending:
                await buffer.flush(link)
        finally:
            link.close()

    asyncio.run(flush_all())
    assert [a.job_id for a in settled] == ids  # every attempt accounted for, in order
    assert buffer.written == 4
    statuses = [row(conn, i)["status"] for i in ids]
    assert statuses == ["done", "ready", "running", "done"]  # the stolen one untouched
    assert row(conn, ids[2])["locked_by"] == "thief"


def test_an_outcome_the_database_refuses_holds_back_no_other(conn, db_url, io) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(4)])
    claims.claim(conn, "w", 10, 30)
    settled: list[Attempt] = []
    buffer = OutcomeBuffer("w", batch_size=10, settled=settled.append)
    for job_id in ids:
        # Built by hand: describe_error would have shown the NUL as \x00.
        error = "bad\x00byte" if job_id == ids[1] else "boom"
        buffer.add(Attempt(job_id, 1, Outcome.RETRY, delay=60, error=error, type="t"))

    async def write_all() -> None:
        link = Link(db_url, "flush", io)
        writer = asyncio.create_task(buffer.run(link))
        try:
            while buffer.unsettled:
                assert not writer.done()
                await asyncio.sleep(0.01)
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            link.close()

    asyncio.run(asyncio.wait_for(write_all(), 30))
    assert sorted(a.job_id for a in settled) == sorted(ids)
    assert buffer.written == 4
    statuses = [row(conn, i)["status"] for i in ids]
    assert statuses == ["ready", "running", "ready", "ready"]  # the refused one: nothing written


def test_the_keeper_extends_held_leases_and_stops_lost_and_cancelled_ones(conn, db_url, io) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)])
    jobs = claims.claim(conn, "w", 10, 30)
    conn.execute("UPDATE rota.job SET locked_until = now() + interval '1 second'")
    keeper = LeaseKeeper("w", lease_seconds=600)

    async def scenario() -> dict[int, Execution]:
        executions = {}
        for job in jobs:
            execution = Execution(job)
            execution.task = asyncio.create_task(asyncio.sleep(3600))
            keeper.hold(execution)
            executions[job.id] = execution
        conn.execute("UPDATE rota.job SET locked_by = 'thief' WHERE id = %s", (ids[1],))
        rota.cancel(conn, [ids[2]])
        link = Link(db_url, "heartbeat", io)
        try:
            await keeper.beat(link)
        finally:
            link.close()
        still_held = executions[ids[0]].task
        assert still_held is not None and not still_held.done()
        still_held.cancel()
        tasks = [e.task for e in executions.values() if e.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        return executions

    executions = asyncio.run(scenario())
    assert [executions[i].stopped for i in ids] == [None, Stop.LEASE_LOST, Stop.CANCEL]
    assert executions[ids[1]].job.cancelled.is_set()
    assert row(conn, ids[0])["locked_until"] > row(conn, ids[0])["started_at"] + _seconds(500)
    assert len(keeper) == 3  # held until their outcomes are settled


def test_a_refused_heartbeat_stops_nothing_and_the_next_one_extends(conn, db_url, io) -> None:
    # The heartbeat's statement refused (its role has no grant on rota.job here):
    # the keeper logs it and goes on, every attempt held and running; the
    # heartbeat loop does not end on it, and the next one that is let through
    # extends the leases.
    role = f"{conn.info.dbname}_no_grants"  # roles are the server's: one per test database
    conn.execute(pgsql.SQL("CREATE ROLE {}").format(pgsql.Identifier(role)))
    rota.enqueue(conn, "t")
    (job,) = claims.claim(conn, "w", 1, 30)
    keeper = LeaseKeeper("w", lease_seconds=600)
    refused_url = make_conninfo(db_url, options=f"-c role={role}")

    async def scenario() -> Execution:
        execution = Execution(job)
        execution.task = asyncio.create_task(asyncio.sleep(3600))
        keeper.hold(execution)
        refused, allowed = Link(refused_url, "heartbeat", io), Link(db_url, "heartbeat", io)
        try:
            await keeper.beat(refused)
            assert execution.stopped is None and not execution.task.done()
            claimed = row(conn, job.id)
            assert claimed["locked_until"] < claimed["started_at"] + _seconds(60)  # not extended
            await keeper.beat(allowed)
        finally:
            refused.close()
            allowed.close()
            execution.task.cancel()
            await asyncio.gather(execution.task, return_exceptions=True)
        return execution

    try:
        execution = asyncio.run(scenario())
    finally:
        conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
    assert execution.stopped is None
    assert row(conn, job.id)["locked_until"] > row(conn, job.id)["started_at"] + _seconds(500)


def _seconds(n: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=n)


def test_a_job_claimed_again_while_its_old_attempt_runs_keeps_its_new_lease(conn, db_url) -> None:
    """The sequence that once let a third run overlap the second: one worker, its
    attempt 1 reaped while still running, the same worker claims attempt 2."""
    job_id = rota.enqueue(conn, "sticky")
    release = {1: threading.Event(), 2: threading.Event()}
    started: list[int] = []

    def sticky(job: Job) -> None:
        started.append(job.attempts)
        release[job.attempts].wait(60)  # ignores job.cancelled on purpose

    handler = Handler("sticky", sticky, is_async=False, wants_context=False)
    settings = WorkerSettings(
        concurrency=1, lease_seconds=3, run_reaper=False, run_scheduler=False,
        poll_interval_seconds=0.2,
    )  # fmt: skip
    worker = Worker(db_url, settings, handlers={"sticky": handler})
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_for(lambda: started == [1], what="attempt 1 to start")
        conn.execute("UPDATE rota.job SET locked_until = now() - interval '1 second'")
        assert Reaper().run_once(conn).requeued == [job_id]
        # The heartbeat finds attempt 1's lease gone and stops it; the slot is free
        # again, and the same worker claims attempt 2.
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
        assert [e.key for e in worker.leases.running] == [(job_id, 2)]
        release[2].set()
        wait_for(lambda: row(conn, job_id)["status"] == "done", what="the job to be done")
        assert (row(conn, job_id)["attempts"], started) == (2, [1, 2])
    finally:
        release[1].set()
        release[2].set()
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def _async_handlers(**funcs: Callable[[Job], Awaitable[None]]) -> dict[str, Handler]:
    return {name: Handler(name, f, is_async=True, wants_context=False) for name, f in funcs.items()}


@contextlib.contextmanager
def _running(
    db_url: str, handlers: dict[str, Handler], concurrency: int, **settings_: Any
) -> Iterator[Worker]:
    """A worker of `handlers` in a thread of this process, stopped at the end (and
    joined within 30 s)."""
    settings = WorkerSettings(
        concurrency=concurrency,
        run_reaper=False,
        run_scheduler=False,
        **{"poll_interval_seconds": 0.2, **settings_},
    )
    worker = Worker(db_url, settings, handlers=handlers)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        yield worker
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


async def _noop(job: Job) -> None:
    return None


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def test_awkward_handler_errors_end_their_jobs_and_the_worker_goes_on(conn, db_url) -> None:
    # PostgreSQL stores no NUL in text and no infinite interval: written as they
    # were, these outcomes failed and took the worker's claim loop down with them.
    # An exception whose message cannot be read left its job running for ever.
    async def nul(job: Job) -> None:
        raise ValueError("bad\x00byte")

    async def forever(job: Job) -> None:
        raise rota.Retry(delay=math.inf)

    async def unprintable(job: Job) -> None:
        raise Unprintable()

    handlers = _async_handlers(nul=nul, forever=forever, unprintable=unprintable, noop=_noop)
    bad = rota.enqueue(conn, "nul", max_attempts=1)
    never = rota.enqueue(conn, "forever", max_attempts=1)
    mute = rota.enqueue(conn, "unprintable", max_attempts=1)
    with _running(db_url, handlers, concurrency=2):
        dead = "SELECT count(*) AS n FROM rota.job WHERE status = 'dead'"
        wait_for(lambda: conn.execute(dead).fetchone()["n"] == 3, what="the three to be dead")
        assert row(conn, bad)["last_error"].startswith("ValueError: bad\\x00byte")
        assert row(conn, never)["last_error"].startswith("ValueError: Retry delay must be")
        assert row(conn, mute)["last_error"].startswith("Unprintable: <its message could not")
        good = rota.enqueue(conn, "noop")
        wait_for(lambda: row(conn, good)["status"] == "done", what="the next job to be done")


def test_a_claim_whose_outcomes_are_refused_goes_on_without_them(conn, db_url, monkeypatch) -> None:
    # An outcome the database cannot take, as a NUL in an error was before
    # describe_error showed it as \x00: the claim carrying it fails, the buffer
    # writes the batch one at a time, and the worker goes on.
    import rota_worker.execute

    monkeypatch.setattr(rota_worker.execute, "describe_error", lambda exc: f"raw: {exc}")

    async def nul(job: Job) -> None:
        raise ValueError("bad\x00byte")

    rota.enqueue_many(conn, [rota.NewJob("nul"), *[rota.NewJob("noop") for _ in range(20)]])
    done = "SELECT count(*) AS n FROM rota.job WHERE type = 'noop' AND status = 'done'"
    with _running(db_url, _async_handlers(nul=nul, noop=_noop), concurrency=4) as worker:
        wait_for(lambda: conn.execute(done).fetchone()["n"] == 20, what="the others to be done")
        wait_for(lambda: worker.outcomes.unsettled == 0, what="every outcome to be settled")
        bad = conn.execute("SELECT status, last_error FROM rota.job WHERE type = 'nul'").fetchone()
        assert bad == {"status": "running", "last_error": None}  # left to its lease


def test_a_refused_claim_waits_and_tries_again_while_running_attempts_finish(
    conn, db_url, monkeypatch
) -> None:
    # The database refuses claims for a while (not an outage: a grant taken back,
    # say). The worker stays up and not ready, the attempt already running ends
    # and its outcome is written meanwhile, and claims resume once allowed.
    refusing = threading.Event()
    refusals = {"n": 0}

    def refused_while(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if refusing.is_set():
                refusals["n"] += 1
                raise DatabaseError("InsufficientPrivilege: permission denied for table job")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(claims, "claim", refused_while(claims.claim))
    monkeypatch.setattr(claims, "write_and_claim", refused_while(claims.write_and_claim))
    gate = threading.Event()

    async def gated(job: Job) -> None:
        while not gate.is_set():
            await asyncio.sleep(0.01)

    first_job = rota.enqueue(conn, "gated")
    with _running(
        db_url, _async_handlers(gated=gated, noop=_noop), concurrency=2, reconnect_max_seconds=0.2
    ) as worker:
        wait_for(lambda: row(conn, first_job)["status"] == "running", 20, "the first job to run")
        refusing.set()
        later = rota.enqueue(conn, "noop")
        wait_for(lambda: refusals["n"] >= 2 and not worker.claims.ready, 20, "claims refused")
        gate.set()
        wait_for(lambda: row(conn, first_job)["status"] == "done", 20, "the running job's outcome")
        assert row(conn, later)["status"] == "ready"  # nothing claimed while refused
        refusing.clear()
        wait_for(lambda: row(conn, later)["status"] == "done", 20, "claims to resume")
        assert worker.claims.ready
    assert [row(conn, i)["attempts"] for i in (first_job, later)] == [1, 1]


def test_the_jobs_of_a_claim_whose_answer_was_lost_are_given_back(
    conn, db_url, monkeypatch
) -> None:
    # The database committed the claim, then the connection broke before its
    # answer arrived: the jobs run under this worker's name and nobody holds them.
    # They are given back, attempt not counted, without waiting for their lease;
    # the first look for them is refused (not an outage), and tried again.
    real = claims.write_and_claim
    real_running_of = claims.running_of
    lost: list[int] = []
    looks: list[str] = []

    def refused_once(*args: Any, **kwargs: Any) -> Any:
        if not looks:
            looks.append("refused")
            raise DatabaseError("InsufficientPrivilege: permission denied for table job")
        looks.append("answered")
        return real_running_of(*args, **kwargs)

    def answer_lost(*args: Any, **kwargs: Any) -> Any:
        written, jobs = real(*args, **kwargs)
        if jobs and not lost:
            lost.extend(job.id for job in jobs)
            raise DatabaseUnavailable("database unavailable: the answer was lost")
        return written, jobs

    monkeypatch.setattr(claims, "write_and_claim", answer_lost)
    monkeypatch.setattr(claims, "running_of", refused_once)
    ids = rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(6)])
    with _running(db_url, _async_handlers(noop=_noop), concurrency=2):
        every = "SELECT count(*) AS n FROM rota.job WHERE status = 'done'"
        wait_for(lambda: conn.execute(every).fetchone()["n"] == 6, timeout=20, what="all done")
    assert lost
    assert looks[:2] == ["refused", "answered"]
    done = [row(conn, i) for i in ids]
    assert [(r["attempts"], r["releases"]) for r in done] == [(1, 0)] * 6  # a release resets


@pytest.mark.parametrize("database", ["back", "still away"])
def test_a_worker_stopping_after_a_lost_claim_gives_its_jobs_back(
    conn, db_url, monkeypatch, caplog, database
) -> None:
    # The answer of a committed claim is lost and the worker is asked to stop at
    # that moment: before it exits, it gives the claim's jobs back (ready, attempt
    # not counted) instead of leaving them running under its name until their
    # lease expires and the reaper counts the attempt. If the database is still
    # away, it says so and exits all the same: the lease is all there is.
    real = claims.write_and_claim
    lost: list[int] = []
    worker = Worker(
        db_url,
        WorkerSettings(concurrency=2, run_reaper=False, run_scheduler=False, lease_seconds=600),
        handlers=_async_handlers(noop=_noop),
    )

    def answer_lost(*args: Any, **kwargs: Any) -> Any:
        written, jobs = real(*args, **kwargs)
        if jobs and not lost:
            lost.extend(job.id for job in jobs)
            worker.stop()
            raise DatabaseUnavailable("database unavailable: the answer was lost")
        return written, jobs

    def away(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseUnavailable("database unavailable: still away")

    monkeypatch.setattr(claims, "write_and_claim", answer_lost)
    if database == "still away":
        monkeypatch.setattr(claims, "running_of", away)
    ids = rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(6)])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert lost
    rows = {i: row(conn, i) for i in ids}
    left = [(rows[i]["status"], rows[i]["attempts"], rows[i]["releases"]) for i in lost]
    if database == "back":
        assert left == [("ready", 0, 1)] * len(lost)
    else:
        assert left == [("running", 1, 0)] * len(lost)
        assert "could not be given back (database unavailable: still away)" in caplog.text
    others = [r for i, r in rows.items() if i not in lost]
    assert all(r["status"] == "ready" and r["attempts"] == 0 for r in others)


def test_an_idle_worker_claims_on_a_notify_and_stops_without_waiting_for_its_poll(
    conn, db_url, monkeypatch
) -> None:
    # An idle worker's next claim waits for a NOTIFY in its I/O thread: a job
    # enqueued meanwhile starts long before the poll interval (60 s), the waiting
    # sends no claims (the second lane has no claim to go ahead of), and a stop
    # wakes the waiting thread (the worker is joined within 30 s).
    sent = {"claims": 0}

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            sent["claims"] += 1
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(claims, "claim", counted(claims.claim))
    monkeypatch.setattr(claims, "write_and_claim", counted(claims.write_and_claim))
    seen = "SELECT seen_at FROM rota.worker WHERE id = %s"
    with _running(
        db_url, _async_handlers(noop=_noop), concurrency=4, poll_interval_seconds=60,
        lease_seconds=3,
    ) as worker:  # fmt: skip
        for _ in range(5):  # fast jobs: the worker claims ahead after the fourth
            fast = rota.enqueue(conn, "noop")
            wait_for(lambda j=fast: row(conn, j)["status"] == "done", 20, "a job to be done")
        before = sent["claims"]
        first_seen = wait_for(lambda: conn.execute(seen, (worker.worker_id,)).fetchone(), 20)
        wait_for(
            lambda: conn.execute(seen, (worker.worker_id,)).fetchone() != first_seen,
            20,
            "a heartbeat of the idle worker (every second)",
        )
        assert worker.claims.claiming_ahead
        assert sent["claims"] - before <= 2
        job_id = rota.enqueue(conn, "noop")
        wait_for(lambda: row(conn, job_id)["status"] == "done", 20, "the next job to be done")


def test_an_idle_worker_starts_what_it_claimed_before_it_waits_again(
    conn, db_url, monkeypatch
) -> None:
    # An idle worker's claim returns a job: the job's handler takes its first step
    # before the next waiting claim goes to an I/O thread (handing it over wakes
    # that thread, which then takes the interpreter from the job's start).
    events: list[tuple[str, int | None]] = []
    real_run = Link.run

    async def run(self: Link, fn: Callable[..., Any], *args: Any) -> Any:
        if getattr(fn, "__name__", "") != "_claim_when_notified":
            return await real_run(self, fn, *args)
        events.append(("wait and claim", None))
        written, jobs = await real_run(self, fn, *args)
        events.extend(("claimed", job.id) for job in jobs)
        return written, jobs

    async def note(job: Job) -> None:
        events.append(("started", job.id))

    monkeypatch.setattr(Link, "run", run)
    with _running(db_url, _async_handlers(note=note), concurrency=2, poll_interval_seconds=60):
        wait_for(lambda: ("wait and claim", None) in events, 20, "the worker to wait for work")
        for _ in range(3):
            job_id = rota.enqueue(conn, "note")
            wait_for(lambda j=job_id: row(conn, j)["status"] == "done", 20, "the job to be done")
            at = events.index(("claimed", job_id))
            assert events[at + 1 : at + 3] == [("started", job_id), ("wait and claim", None)]
