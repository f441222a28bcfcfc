"""Claiming ahead: the bookkeeping of jobs claimed before a slot is free for
them, in-process (no database), a real worker giving back a job that could not
start in time, and a job given back and claimed again in one statement."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import rota
from rota import claim as claims
from rota.attempt import Attempt
from rota.handlers import Handler
from rota.jobs import Job, Outcome, Status
from rota.lookup import get_job
from rota_worker.attempts import Attempts, Event, Execution
from rota_worker.claiming import ClaimLoop
from rota_worker.link import Link
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.settings import WorkerSettings
from rota_worker.slots import AHEAD_FAST_SECONDS, AHEAD_MAX_WAIT_SECONDS, Slots
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _noop, row

NOW = datetime(2030, 1, 1, tzinfo=UTC)
C = 3


def job(job_id: int) -> Job:
    return Job(job_id, "t", {}, None, Status.RUNNING, NOW, 1, 20)


class Parts:
    """A claim loop with its attempts, slots and buffer; a start records the job
    instead of running it."""

    def __init__(self, claim_ahead: bool = True) -> None:
        self.settings = WorkerSettings(concurrency=C, claim_ahead=claim_ahead)
        self.attempts = Attempts(C, 30)
        self.buffer = OutcomeBuffer("w", 100, self.attempts)
        self.stopping = asyncio.Event()
        self.begun: list[int] = []
        self.slots = Slots(
            self.settings, self.attempts, self.buffer, {}, None,  # type: ignore[arg-type]
            None, lambda: None,  # type: ignore[arg-type]
        )  # fmt: skip
        self.slots._begin = lambda record: self.begun.append(record.job.id)  # type: ignore[method-assign]
        self.loop = ClaimLoop(
            self.settings, ["t"], self.attempts, self.buffer, self.slots, self.stopping
        )

    def claimed(self, *ids: int) -> list[Execution]:
        self.slots.hold([job(i) for i in ids])
        records = [r for r in self.attempts.snapshot() if r.job.id in ids]
        self.slots.start_waiting()
        return records

    def end(self, job_id: int, seconds: float = 0.001) -> None:
        (record,) = [r for r in self.attempts.running if r.job.id == job_id]
        record.outcome = Attempt(
            job_id, 1, Outcome.DONE, type="t", duration_seconds=seconds, claim=1
        )
        self.attempts.dispatch(record, Event.FINISHED)

    def stop(self) -> None:
        self.stopping.set()
        self.slots.stopping = True

    @property
    def pending(self) -> list[Attempt]:
        return [r.outcome for r in self.buffer.pending if r.outcome is not None]


def test_fast_attempts_open_a_batch_ahead_and_the_concurrency_still_holds() -> None:
    parts = Parts()
    assert parts.loop.free_slots() == C  # nothing known yet: only the free slots
    parts.claimed(1, 2, 3)
    assert parts.begun == [1, 2, 3] and parts.loop.free_slots() == 0
    for i in (1, 2, 3):
        parts.end(i)
    assert parts.loop.claiming_ahead
    parts.claimed(4, 5, 6, 7, 8, 9)  # a batch ahead: three start, three wait
    assert parts.begun[3:] == [4, 5, 6] and len(parts.attempts.waiting_for_a_slot) == 3
    assert parts.attempts.slots_taken == C
    parts.end(4)
    assert parts.begun[6:] == [7] and parts.attempts.slots_taken == C  # the freed slot, at once


def test_one_slow_attempt_stops_claiming_ahead() -> None:
    parts = Parts()
    parts.claimed(1, 2, 3)
    for i in (1, 2, 3):
        parts.end(i)
    assert parts.loop.claiming_ahead
    parts.claimed(4)
    parts.end(4, seconds=AHEAD_FAST_SECONDS * 2)
    assert not parts.loop.claiming_ahead


def test_without_claiming_ahead_only_free_slots_are_claimed() -> None:
    parts = Parts(claim_ahead=False)
    parts.claimed(1, 2, 3)
    for i in (1, 2, 3):
        parts.end(i)
    assert not parts.loop.claiming_ahead and parts.loop.free_slots() == C


def test_a_job_that_waited_too_long_for_a_slot_is_given_back_uncounted() -> None:
    parts = Parts()
    waiting = parts.claimed(1, 2, 3, 4)[3]
    assert parts.slots.give_back_stale(waiting.held_at + AHEAD_MAX_WAIT_SECONDS / 2) == 0
    assert parts.slots.give_back_stale(waiting.held_at + AHEAD_MAX_WAIT_SECONDS) == 1
    [given_back] = parts.pending
    assert (given_back.job_id, given_back.outcome) == (4, Outcome.RELEASED)
    assert given_back.error is None and given_back.delay == 0  # no error recorded, ready at once
    assert parts.begun == [1, 2, 3]


def test_a_waiting_job_cancelled_or_lost_never_starts() -> None:
    parts = Parts()
    executions = parts.claimed(1, 2, 3, 4, 5)
    executions[3].stop(Event.CANCEL)
    executions[4].stop(Event.LEASE_LOST)
    assert executions[3].job.cancelled.is_set()
    parts.end(1)
    parts.end(2)
    assert parts.begun == [1, 2, 3]
    outcomes = {a.job_id: a.outcome for a in parts.pending}
    assert outcomes[4] == Outcome.CANCELLED and outcomes[5] == Outcome.LEASE_LOST


def test_at_shutdown_waiting_jobs_are_given_back_not_started() -> None:
    parts = Parts()
    parts.claimed(1, 2, 3, 4)
    parts.stop()
    parts.end(1)
    assert parts.begun == [1, 2, 3]
    released = [a for a in parts.pending if a.job_id == 4]
    assert [a.outcome for a in released] == [Outcome.RELEASED]


def test_a_worker_gives_back_a_job_claimed_ahead_of_a_slow_one(conn, db_url) -> None:
    gate = threading.Event()
    started: list[str] = []

    def work(j: Job) -> None:
        started.append(j.payload["name"])
        if j.payload["name"] == "slow":
            gate.wait(60)

    handler = Handler("t", work, is_async=False, wants_context=False)
    settings = WorkerSettings(
        concurrency=1, run_reaper=False, run_scheduler=False, poll_interval_seconds=0.2
    )
    worker = Worker(db_url, settings, handlers={"t": handler})
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        warm = rota.enqueue(conn, "t", {"name": "warm"})
        wait_for(lambda: get_job(conn, warm).status == "done", what="the first job")
        assert worker.claims.claiming_ahead
        slow, queued = rota.enqueue_many(
            conn, [rota.NewJob("t", {"name": "slow"}), rota.NewJob("t", {"name": "queued"})]
        )
        # Both come in one claim; the second waits for the only slot, then goes back.
        wait_for(lambda: get_job(conn, queued).releases == 1, what="the waiting job to go back")
        back = get_job(conn, queued)
        assert (back.status, back.attempts, back.last_error) == ("ready", 0, None)
        assert started == ["warm", "slow"] and get_job(conn, slow).status == "running"
        gate.set()
        wait_for(lambda: get_job(conn, queued).status == "done", what="the job given back to run")
        assert started == ["warm", "slow", "queued"] and get_job(conn, queued).attempts == 1
    finally:
        gate.set()
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_slot_freed_late_never_starts_a_job_that_waited_too_long() -> None:
    """A process stopped past its leases wakes with jobs claimed ahead: they go back."""
    parts = Parts()
    waiting = parts.claimed(1, 2, 3, 4)[3]
    waiting.held_at -= AHEAD_MAX_WAIT_SECONDS
    parts.end(1)
    assert parts.begun == [1, 2, 3] and parts.attempts.slots_taken == C - 1
    assert [(a.job_id, a.outcome) for a in parts.pending][-1] == (4, Outcome.RELEASED)


class GatedLink:
    """A claim connection whose claims stay in flight until the test opens the gate."""

    def __init__(self, name: str, calls: list[tuple[str, int]], gate: asyncio.Event) -> None:
        self.name, self.calls, self.gate = name, calls, gate

    async def run(self, fn: object, *args: object) -> object:
        if fn is not claims.write_and_claim:
            return {}  # what became of outcomes the claim did not write: nothing known
        limit = args[2]
        assert isinstance(limit, int)
        self.calls.append((self.name, limit))
        await self.gate.wait()
        return {}, []


def test_while_claiming_ahead_two_claims_of_a_batch_each_are_in_flight_at_once() -> None:
    # One claim of both batches kept a single process's claims one at a time: the
    # database worked on one while the second connection had nothing to ask for.
    parts = Parts()
    parts.claimed(1, 2, 3)
    for i in (1, 2, 3):
        parts.end(i)
    assert parts.loop.claiming_ahead

    async def scenario() -> list[tuple[str, int]]:
        gate, calls = asyncio.Event(), []
        links = GatedLink("lead", calls, gate), GatedLink("ahead", calls, gate)
        task = asyncio.create_task(parts.loop.run(*links))  # type: ignore[arg-type]
        for _ in range(1000):  # turns of the event loop, no clock
            if len(calls) >= 2:
                break
            await asyncio.sleep(0)
        seen = list(calls)
        parts.stop()
        parts.loop.statements.end_idle_wait()
        parts.loop.wake()
        gate.set()
        await asyncio.wait_for(task, 30)
        return seen

    assert asyncio.run(scenario()) == [("lead", C), ("ahead", C)]


def test_a_job_given_back_and_claimed_again_in_one_statement_stays_held(conn, db_url) -> None:
    # A job claimed ahead waited too long and is given back; the claim that
    # carries that outcome picks the same job again, at the same attempt number.
    # The new attempt is a new record: settling the old one must not let go of it.
    rota.enqueue(conn, "t")
    worker = Worker(
        db_url,
        WorkerSettings(concurrency=1, run_reaper=False, run_scheduler=False, lease_seconds=600),
        handlers=_async_handlers(t=_noop),
    )
    slots, attempts, buffer = worker.slots, worker.attempts, worker.outcomes
    io = ThreadPoolExecutor(1)

    async def scenario() -> None:
        link = Link(db_url, "claim", io)
        worker.leases.loop = asyncio.get_running_loop()
        try:
            (job,) = await link.run(claims.claim, worker.worker_id, 1, 600, ["t"])
            slots.hold([job])
            (old,) = attempts.snapshot()
            assert slots.give_back_stale(old.held_at + AHEAD_MAX_WAIT_SECONDS) == 1
            batch = buffer.take()
            written, again = await link.run(
                claims.write_and_claim, worker.worker_id, buffer.to_write(batch), 1, 600, ["t"]
            )
            assert [(j.id, j.attempts) for j in again] == [(job.id, job.attempts)]
            slots.hold(again)
            new = attempts.snapshot()[-1]
            await buffer.settle(link, batch, written)
            held = attempts.snapshot()
            assert any(e is new for e in held) and not any(e is old for e in held)
            before = row(conn, job.id)["locked_until"]
            await asyncio.get_running_loop().run_in_executor(None, worker.leases.step)
            await asyncio.sleep(0)
            assert row(conn, job.id)["locked_until"] > before  # its lease renewal goes on
            assert new.stopped is None
        finally:
            link.close()
            worker.leases.close()

    try:
        asyncio.run(scenario())
    finally:
        io.shutdown()
