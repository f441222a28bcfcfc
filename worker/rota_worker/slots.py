"""Held attempts into free slots, and what ended out to the outcome buffer.

The claim loop hands every claimed job here (`hold`); each becomes a CLAIMED
record of `rota_worker.attempts` and starts the moment a slot is free, oldest
first. A job claimed ahead that found no slot within `AHEAD_MAX_WAIT_SECONDS`
is given back, never started (its lease may be gone by then: this process was
stopped, say, and the job ran elsewhere). A job whose row could not be read
never starts either: it is written dead at once. When an attempt ends, its
outcome goes to the buffer and its slot to the next claimed record.

It also counts how fast attempts end: while the last `concurrency` attempts
each took under `AHEAD_FAST_SECONDS`, the claim loop claims ahead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from rota.decoding import Unreadable
from rota.handlers import Context, Handler
from rota.jobs import Job
from rota_worker.attempts import SLOTTED, Attempts, Event, Execution, State
from rota_worker.execute import (
    SyncRunner,
    outcome_of_error,
    run_attempt,
    stopped_outcome,
    timeout_of,
)
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.settings import WorkerSettings

log = logging.getLogger("rota.worker")

AHEAD_FAST_SECONDS = 0.05
"""Attempts shorter than this count as fast: worth claiming ahead for."""

AHEAD_MAX_WAIT_SECONDS = 1.0
"""A job claimed ahead that could not start within this long is given back."""

STOP_WAIT_SECONDS = 2.0
"""At shutdown, how long attempts stopped at the end of the grace period are
waited for before they are given up."""

STOP_WRITE_SECONDS = 0.5
"""At shutdown, the least time the outcomes are given to be written."""

STOP_MARGIN_SECONDS = 3.0
"""At shutdown, how long after the grace period the outcomes may take to be
written: the stop then ends (within about a second more for the loops and
connections), 25 + 3 s by default, under Kubernetes' 30 s."""


class Slots:
    def __init__(
        self,
        settings: WorkerSettings,
        attempts: Attempts,
        outcomes: OutcomeBuffer,
        handlers: dict[str, Handler],
        context: Context,
        run_sync: SyncRunner,
        slot_freed: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.attempts = attempts
        self.outcomes = outcomes
        self.handlers = handlers
        self.context = context
        self.run_sync = run_sync
        self._slot_freed = slot_freed
        self.fast_in_a_row = 0
        """Attempts in a row that ended under AHEAD_FAST_SECONDS."""
        self.stopping = False
        """The worker stops: claimed records are given back, never started."""
        self.stopped_at: float | None = None
        """When the worker was asked to stop (`clock`): its grace period runs from then."""
        self.eager = False
        """Tasks take their first step inside create_task (the loop's eager factory)."""
        self.clock: Callable[[], float] = time.monotonic
        """The clock of the waits of jobs claimed ahead (a test sets its own)."""
        self._starting = False
        attempts.ended = self.ended

    @property
    def claiming_ahead(self) -> bool:
        s = self.settings
        return s.claim_ahead and self.fast_in_a_row >= s.concurrency

    def claimable(self, asked: int) -> int:
        """Jobs the next claim may take, beside claims in flight asking for `asked`:
        one per slot not running or spoken for (and a batch more while claiming
        ahead), *and* the attempts held (claimed, running, or ended with outcomes
        not yet written) stay under the cap, so a fast queue never claims faster
        than it writes; one batch (the concurrency) at most, so that while claiming
        ahead the batch ahead is left to the second lane's claim."""
        c = self.settings.concurrency
        ahead = c if self.claiming_ahead else 0
        attempts = self.attempts
        taken = attempts.slots_taken + len(attempts.waiting_for_a_slot) + asked
        return min(c + ahead - taken, self.cap() - len(attempts) - asked, c)

    def cap(self) -> int:
        """Most attempts held at once: twice the concurrency; while claiming ahead,
        a batch more waiting and a batch more of outcomes to carry."""
        c = self.settings.concurrency
        return 2 * c + (2 * c if self.claiming_ahead else 0)

    def under_cap(self) -> bool:
        return len(self.attempts) < self.cap()

    def hold(self, jobs: list[Job]) -> None:
        """Claimed jobs: held from now until their outcome is settled."""
        now = self.clock()
        default = self.settings.job_timeout_seconds
        for job in jobs:
            timeout = timeout_of(job, self.handlers.get(job.type), default)
            record = self.attempts.claimed(job, timeout, now)
            if type(job.payload) is Unreadable:
                log.error("job %s attempt %s: %s", job.id, job.attempts, job.payload.error)
                self.attempts.dispatch(record, Event.UNREADABLE)

    def start_waiting(self) -> None:
        """Start claimed records while slots are free (at shutdown: give them back)."""
        if self._starting:
            # An attempt started eagerly ended inside `_begin` (its handler never
            # waited): the call that started it goes on with the next, instead of
            # one nested call per job.
            return
        self._starting = True
        try:
            self.give_back_stale()
            waiting = self.attempts.waiting_for_a_slot
            while waiting and (self.stopping or self.attempts.slots_free > 0):
                record = waiting[0]
                if self.stopping:
                    self.attempts.dispatch(record, Event.SHUTDOWN)
                    continue
                self.attempts.dispatch(record, Event.STARTED)
                self._begin(record)
        finally:
            self._starting = False

    def give_back_stale(self, now: float | None = None) -> int:
        """Give back the jobs claimed ahead that have waited too long for a slot
        (the oldest wait first)."""
        now = self.clock() if now is None else now
        waiting = self.attempts.waiting_for_a_slot
        stale = 0
        while waiting and now - waiting[0].held_at >= AHEAD_MAX_WAIT_SECONDS:
            self.attempts.dispatch(waiting[0], Event.NO_SLOT)
            stale += 1
        if stale:
            self.fast_in_a_row = 0
            log.info("%d jobs claimed ahead found no free slot in time; given back", stale)
        return stale

    def ended(self, record: Execution, was: State) -> None:
        """A record reached ENDED: its outcome goes to the buffer; if it had a slot,
        the slot goes to the next claimed record.

        The claim loop is woken first, so that it runs (and sends its next claim)
        before the attempts started here do: the database then works on the claim
        while this process runs them."""
        if record.outcome is None:  # never started: the reason decides
            outcome = stopped_outcome(record, self.settings.backoff)
            record.outcome = dataclasses.replace(outcome, type=record.job.type)
        self.outcomes.add(record)
        if was not in SLOTTED:
            return
        if record.outcome.duration_seconds < AHEAD_FAST_SECONDS:
            self.fast_in_a_row += 1
        else:
            self.fast_in_a_row = 0
        self._slot_freed()
        self.start_waiting()

    async def drain(self, grace: float) -> None:
        """The worker stops: let running attempts finish within `grace` of the stop,
        stop the rest (given back), then wait for every outcome to be settled, by
        `STOP_MARGIN_SECONDS` after the grace period."""
        grace_ends = (self.clock() if self.stopped_at is None else self.stopped_at) + grace
        running = self._tasks()
        log.info("stopping: %d jobs running, grace period %.0fs", len(running), grace)
        if running:
            await asyncio.wait(running, timeout=max(grace_ends - self.clock(), 0.0))
        for record in self.attempts.running:
            if record.state is State.RUNNING:  # one already stopping ends as its stop says
                log.warning(
                    "job %s attempt %s did not finish within the grace period; given back",
                    *record.id_and_attempt,
                )
            self.attempts.stop(record, Event.SHUTDOWN)
        stopped = self._tasks()
        if stopped:
            await asyncio.wait(stopped, timeout=STOP_WAIT_SECONDS)
        overrunning = self._tasks()
        for task in overrunning:
            # A handler that ignores its stop even now: its thread ends with the
            # process (a child is killed), and its job is given back.
            task.cancel()
        written_by = grace_ends + STOP_MARGIN_SECONDS
        if overrunning:
            await asyncio.wait(overrunning, timeout=max(written_by - self.clock(), 0.0))
        for record in self.attempts.running:
            if record.task is not None and not record.task.done():
                # An async handler that swallows every cancellation: its task is
                # left behind (the loop closes on it), and its job given back.
                log.error(
                    "job %s attempt %s: its handler ignores its cancellation;"
                    " given back, its task left behind",
                    *record.id_and_attempt,
                )
                self.attempts.dispatch(record, Event.FINISHED)  # the stop decides
        self.outcomes.wake.set()
        try:
            await asyncio.wait_for(
                self.attempts.settled_all(), max(written_by - self.clock(), STOP_WRITE_SECONDS)
            )
        except TimeoutError:
            log.error(
                "%d outcomes could not be written; their leases will expire",
                self.outcomes.unsettled,
            )

    def _tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self.attempts.running if r.task is not None and not r.task.done()]

    def _begin(self, record: Execution) -> None:
        handler = self.handlers.get(record.job.type)
        record.task = asyncio.create_task(self._execute(record, handler))

    async def _execute(self, record: Execution, handler: Handler | None) -> None:
        # Started eagerly, this runs inside create_task, before `_begin` can assign
        # the task: the attempt's clock and its stop need it from the first step.
        # It returns nothing: a task whose result were the attempt would close a
        # cycle (task, attempt, record, the record's task) that only the garbage
        # collector frees, a job at a time.
        if self.eager:
            record.task = asyncio.current_task()
        backoff = self.settings.backoff
        try:
            outcome = await run_attempt(record, handler, self.context, self.run_sync, backoff)
        except Exception as exc:  # a fault of the worker's own: the slot must not be lost
            log.exception(
                "job %s attempt %s: the attempt failed outside its handler", *record.id_and_attempt
            )
            failed = outcome_of_error(record.job, exc, backoff)
            outcome = dataclasses.replace(failed, type=record.job.type)
        if record.state not in (State.RUNNING, State.STOPPING):
            return  # ended without it at shutdown (its handler ignored its stop)
        record.outcome = outcome
        self.attempts.dispatch(record, Event.FINISHED)
