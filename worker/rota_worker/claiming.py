"""The claim loop: claims into free slots, carrying the pending outcomes along.

It claims as many jobs as there are free slots, in one statement, and writes
the outcomes waiting in the buffer in the same transaction (one round trip, one
commit per batch). When the queue is empty its next claim waits for a NOTIFY
or the poll interval, in the I/O thread that sends it; when every slot is busy
it waits for one to be freed, and lets the outcome buffer write on its own
meanwhile.

Claiming ahead: while jobs end fast (the last `concurrency` attempts each under
`AHEAD_FAST_SECONDS`), it also claims the batch after the one running, so that
the database works on the next claim while this process runs the current
batch, instead of each waiting for the other. A job claimed ahead is held (its
lease is renewed) and starts the moment a slot frees; it never waits longer
than `AHEAD_MAX_WAIT_SECONDS` (it is given back, its attempt not counted), and
one slow attempt turns claiming ahead off until fast ones are the rule again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from rota import claim as claims
from rota.claim import Attempt
from rota.db import Conn
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.jobs import Job, Outcome, Status
from rota_worker.attempts import State
from rota_worker.execute import Execution, Stop, stopped_outcome
from rota_worker.leases import Key, LeaseKeeper
from rota_worker.link import Backoff, Link, first
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.settings import WorkerSettings

log = logging.getLogger("rota.worker")

AHEAD_FAST_SECONDS = 0.05
"""Attempts shorter than this count as fast: worth claiming ahead for."""

AHEAD_MAX_WAIT_SECONDS = 1.0
"""A job claimed ahead that could not start within this long is given back."""

STOP_GIVE_BACK_SECONDS = 5.0
"""How long a stopping worker tries to give back the jobs of a lost claim."""


class ClaimLoop:
    def __init__(
        self,
        settings: WorkerSettings,
        types: Sequence[str],
        leases: LeaseKeeper,
        outcomes: OutcomeBuffer,
        hold: Callable[[Job], Execution],
        begin: Callable[[Execution], None],
        stopping: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.types = list(types)
        self.leases = leases
        self.outcomes = outcomes
        self._hold = hold
        self._begin = begin
        self._stopping = stopping
        self.waiting: deque[Execution] = deque()
        """Claimed, held, not started yet (no slot was free), oldest first."""
        self.active = 0
        """Attempts started whose handler has not ended."""
        self._fast_in_a_row = 0
        self._requested = 0
        """Jobs asked for by the claims in flight."""
        self._parked: asyncio.Future[None] | None = None
        self.jobs_notified = threading.Event()
        """Set by the listener thread when a job that can run now was enqueued (and
        when the worker stops): an idle claim waits for it."""
        self._lead_idle = False
        """The first lane's claim waits for a NOTIFY: no claim to go ahead of."""
        self._no_more_claims = False
        """The worker stops, or the lanes are done: an idle claim still waiting for a
        NOTIFY returns without claiming."""
        self.ready = False
        """The database answered the last claim."""
        self._claim_lost = False
        """A claim failed in flight: the database may have committed it, and its jobs
        be running under this worker's name with nobody here holding them."""
        self._recovering = False
        self.last_tick = time.monotonic()
        """When the loop last turned (for /healthz)."""

    @property
    def claiming_ahead(self) -> bool:
        s = self.settings
        return s.claim_ahead and self._fast_in_a_row >= s.concurrency

    def free_slots(self) -> int:
        """Jobs the next claim may take: one per slot not running or spoken for (and
        a batch more while claiming ahead), *and* the attempts held (waiting, running,
        or finished with outcomes not yet written) stay under the cap, so a fast
        queue never claims faster than it writes."""
        c = self.settings.concurrency
        ahead = c if self.claiming_ahead else 0
        taken = self.active + len(self.waiting) + self._requested
        return min(c + ahead - taken, self._cap() - len(self.leases) - self._requested)

    def _cap(self) -> int:
        """Most attempts held at once: twice the concurrency; while claiming ahead,
        a batch more waiting and a batch more of outcomes to carry."""
        c = self.settings.concurrency
        return 2 * c + (2 * c if self.claiming_ahead else 0)

    # -- starting and ending attempts ---------------------------------------------
    def attempt_ended(self, attempt: Attempt) -> None:
        """An attempt's handler is done: its slot goes to the next waiting job.

        The loop is woken first, so that it runs (and sends its next claim) before
        the attempts started here do: the database then works on the claim while
        this process runs them."""
        self.active -= 1
        if attempt.duration_seconds < AHEAD_FAST_SECONDS:
            self._fast_in_a_row += 1
        else:
            self._fast_in_a_row = 0
        self.wake()
        self.start_waiting()

    def wake(self) -> None:
        """Resume the loop if it waits for a slot (an attempt ended, an outcome was
        settled, or the worker stops)."""
        parked = self._parked
        if parked is not None and not parked.done():
            parked.set_result(None)

    async def _park(self, timeout: float | None) -> None:
        """Wait for `wake` (or `timeout`): one future, so the loop resumes on the
        next turn of the event loop, ahead of the tasks started meanwhile."""
        loop = asyncio.get_running_loop()
        if self._parked is None or self._parked.done():
            self._parked = loop.create_future()
        parked = self._parked
        timer = loop.call_later(timeout, self.wake) if timeout is not None else None
        try:
            await parked
        finally:
            if timer is not None:
                timer.cancel()

    def end_idle_wait(self) -> None:
        """Wake an idle claim waiting for a NOTIFY; it returns without claiming (the
        worker stops, or the lanes are done)."""
        self._no_more_claims = True
        self.jobs_notified.set()

    def start_waiting(self) -> None:
        """Start waiting jobs while slots are free (at shutdown: give them back)."""
        # One that waited too long is given back, never started: its lease may be
        # gone (this process was stopped, say) and the job run elsewhere.
        self.give_back_stale()
        limit = self.settings.concurrency
        while self.waiting and (self.active < limit or self._stopping.is_set()):
            execution = self.waiting.popleft()
            if self._stopping.is_set():
                execution.stop(Stop.SHUTDOWN)
            if execution.stopped is not None:
                self._never_started(execution)
                continue
            self.active += 1
            execution.move(State.RUNNING)
            self._begin(execution)

    def give_back_stale(self, now: float | None = None) -> int:
        """Give back the jobs claimed ahead that have waited too long for a slot
        (the oldest wait first)."""
        now = time.monotonic() if now is None else now
        stale = 0
        while self.waiting and now - self.waiting[0].held_at >= AHEAD_MAX_WAIT_SECONDS:
            self._never_started(self.waiting.popleft())
            stale += 1
        if stale:
            self._fast_in_a_row = 0
            log.info("%d jobs claimed ahead found no free slot in time; given back", stale)
        return stale

    def _never_started(self, execution: Execution) -> None:
        job = execution.job
        if execution.stopped is None:
            attempt = Attempt(job.id, job.attempts, Outcome.RELEASED)
        else:
            attempt = stopped_outcome(execution, self.settings.backoff)
        execution.move(State.ENDED)
        self.outcomes.add(dataclasses.replace(attempt, type=job.type, owner=execution))

    # -- the loop ---------------------------------------------------------------
    async def run(self, link: Link, ahead: Link | None = None) -> None:
        """Claim until the worker stops: on `link`, and while claiming ahead also on
        `ahead`, so that two claims can be in flight, each on its own connection."""
        lanes = [asyncio.create_task(self._claim_and_carry(link, lead=True))]
        if ahead is not None and self.settings.claim_ahead:
            lanes.append(asyncio.create_task(self._claim_and_carry(ahead, lead=False)))
        try:
            await asyncio.gather(*lanes)
        finally:
            self.end_idle_wait()
            for lane in lanes:  # one lane failed: the other stops too
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            self.outcomes.carry(False)
            self.start_waiting()
        if self._claim_lost:
            await self._give_back_lost_claim_at_stop(link)

    async def _claim_and_carry(self, link: Link, lead: bool) -> None:
        backoff = Backoff(most=self.settings.reconnect_max_seconds)
        s = self.settings
        idle = False  # this lane's last claim found the queue empty
        refused = False  # the database refused this lane's last claim
        while not self._stopping.is_set():
            self.last_tick = time.monotonic()
            self.give_back_stale(self.last_tick)
            if self._recovering:  # the other lane gives back the jobs of a lost claim
                await self._park(s.poll_interval_seconds)
                continue
            if self._claim_lost:
                try:
                    await self._give_back_lost_claim(link)
                except (DatabaseUnavailable, DatabaseError) as exc:
                    # Away or refused: tried again after a wait, as a claim is.
                    await self._wait_after(exc, backoff)
                    continue
            if not lead and not (self.claiming_ahead and self._requested and not self._lead_idle):
                # The second lane claims only ahead of fast jobs, beside a claim in
                # flight on the first (so an idle worker polls on one lane).
                await self._park(s.poll_interval_seconds)
                continue
            free = self.free_slots()
            if free <= 0:
                # Slots full of running attempts: the next to end frees one and its
                # outcome goes with the claim that fills it. Outcomes already
                # waiting, or too many held, are written by the buffer meanwhile,
                # unless a claim is in flight: its lane carries them when it is back.
                self.outcomes.carry(
                    self._requested > 0 or (not self.outcomes.pending and self._under_cap())
                )
                await self._park(AHEAD_MAX_WAIT_SECONDS if self.waiting else None)
                continue
            # An idle lead lane's claim waits for a NOTIFY in its I/O thread and
            # carries no outcomes: the buffer writes them meanwhile. So does a
            # claim after one the database refused, which may be refused again.
            waits = lead and idle
            alone = waits or refused
            self.outcomes.carry(not alone)
            batch = [] if alone else self.outcomes.take()
            if not waits:
                self.jobs_notified.clear()
            self._requested += free
            self._lead_idle = waits
            try:
                if waits:
                    written, jobs = await link.run(self._claim_when_notified, free)
                else:
                    written, jobs = await link.run(
                        claims.write_and_claim,
                        s.worker_id,
                        self.outcomes.to_write(batch),
                        free,
                        s.lease_seconds,
                        self.types,
                    )
            except DatabaseUnavailable as exc:
                self.outcomes.give_back(batch)
                self.outcomes.carry(False)
                self.ready = False
                self._claim_lost = True
                idle = False  # after a failed claim the next goes at once, notified or not
                await self._wait_after(exc, backoff)
                continue
            except DatabaseError as exc:
                if not batch:
                    # The claim alone was refused: the worker's role lost a
                    # grant, say. Attempts running go on and the buffer writes
                    # their outcomes; claims wait, not ready, and try again.
                    self.outcomes.carry(False)
                    self.ready = False
                    idle = False
                    refused = True
                    await self._wait_after(exc, backoff)
                    continue
                # Perhaps one outcome the database cannot take: the buffer writes
                # them one at a time, and this lane claims without them.
                self.outcomes.refused(batch, exc)
                self.outcomes.carry(False)
                continue
            except BaseException:
                self.outcomes.give_back(batch)
                raise
            finally:
                self._requested -= free
                self._lead_idle = False
            self.ready = True
            refused = False
            backoff.reset()
            for job in jobs:
                self.waiting.append(self._hold(job))
            self.start_waiting()
            if batch:
                with contextlib.suppress(DatabaseUnavailable):
                    await self.outcomes.settle(link, batch, written)
            idle = len(jobs) < free
            if idle:
                # The queue is empty: the lead lane's next claim waits for a NOTIFY
                # or the poll interval, the second lane for an attempt to end.
                self.outcomes.carry(False)
                if not lead:
                    await self._park(s.poll_interval_seconds)
                elif jobs:
                    # The attempts just started take their first step before the
                    # next claim is handed to an I/O thread, whose wake-up would
                    # take the interpreter from them (a tenth of a millisecond
                    # of an idle worker's enqueue-to-start time).
                    await asyncio.sleep(0)

    def _claim_when_notified(self, conn: Conn, limit: int) -> tuple[dict[Key, Status], list[Job]]:
        """In the lead lane's I/O thread: wait for a NOTIFY of a job that can run now
        (or the poll interval), then claim at once. The listener thread wakes this
        thread directly: the event loop and a thread hand-off are not in between,
        which takes about a tenth of the enqueue-to-start time off an idle worker."""
        self.jobs_notified.wait(self.settings.poll_interval_seconds)
        self.jobs_notified.clear()
        if self._no_more_claims:
            return {}, []
        s = self.settings
        return {}, claims.claim(conn, s.worker_id, limit, s.lease_seconds, self.types)

    async def _wait_after(self, exc: DatabaseUnavailable | DatabaseError, backoff: Backoff) -> None:
        """The database is away (a warning) or refused the claim (an error): wait the
        next backoff step (or until the worker stops)."""
        delay = backoff.next()
        level = logging.WARNING if isinstance(exc, DatabaseUnavailable) else logging.ERROR
        log.log(level, "claim failed (%s); retrying in %.1fs", exc, delay)
        await first(self._stopping, timeout=delay)

    async def _give_back_lost_claim(self, link: Link) -> None:
        """Give back the jobs of a claim whose answer was lost: the rows running under
        this worker's name that it does not hold. Their attempt is not counted, and
        they wait for no lease to expire.

        Claims stop meanwhile, and a claim in flight on the other lane is waited
        for first (an idle one returns at its NOTIFY or its poll interval): once
        answered, its jobs are held, never taken for lost ones."""
        self._recovering = True
        try:
            while self._requested:
                await asyncio.sleep(0.01)
            running = await link.run(claims.running_of, self.settings.worker_id)
            lost = [
                Attempt(job_id, attempts, Outcome.RELEASED)
                for job_id, attempts in running
                if not self.leases.holds((job_id, attempts))
            ]
            if lost:
                written = await link.run(claims.write_outcomes, self.settings.worker_id, lost)
                log.warning(
                    "%d jobs of a claim whose answer was lost given back: %s",
                    len(written),
                    ", ".join(str(job_id) for job_id, _ in sorted(written)),
                )
            self._claim_lost = False
        finally:
            self._recovering = False
            self.wake()

    async def _give_back_lost_claim_at_stop(self, link: Link) -> None:
        """The worker stops with the jobs of a lost claim not given back yet: one
        try, so that they need not wait for their lease (which would count their
        attempt). If the database is still away (or too slow to answer within
        `STOP_GIVE_BACK_SECONDS`, which the shutdown's grace must not wait for),
        the lease is all there is."""
        try:
            await asyncio.wait_for(self._give_back_lost_claim(link), STOP_GIVE_BACK_SECONDS)
            return
        except TimeoutError:
            why = f"no answer within {STOP_GIVE_BACK_SECONDS:g}s"
        except (DatabaseUnavailable, DatabaseError) as exc:
            why = str(exc)
        log.warning(
            "the jobs of a claim whose answer was lost could not be given back (%s);"
            " they run again when their leases expire",
            why,
        )

    def _under_cap(self) -> bool:
        return len(self.leases) < self._cap()
