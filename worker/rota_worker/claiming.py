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
import enum
import logging
import threading
import time
from collections.abc import Sequence

from rota import claim as claims
from rota.attempt import Attempt, Key
from rota.db import Conn
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.floor import Floor
from rota.jobs import Job, Outcome, Status
from rota_worker.attempts import Attempts, Execution
from rota_worker.link import Backoff, Link, first
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.settings import WorkerSettings
from rota_worker.slots import AHEAD_MAX_WAIT_SECONDS, Slots

log = logging.getLogger("rota.worker")

STOP_GIVE_BACK_SECONDS = 5.0
"""How long a stopping worker tries to give back the jobs of a lost claim."""


class LaneState(enum.StrEnum):
    """Where a lane's claims stand after its last answer."""

    CLAIMING = "claiming"
    """Its claims carry the pending outcomes along."""
    IDLE = "idle"
    """Its last claim found the queue empty: the lead lane's next claim waits for a
    NOTIFY (or the poll interval) and carries no outcomes."""
    REFUSED = "refused"
    """The database refused its last claim: the next one carries no outcomes, which
    the buffer writes meanwhile."""


class Recovery(enum.StrEnum):
    """The jobs of a claim whose answer was lost (the claim may have committed)."""

    NONE = "none"
    """Nothing to give back: lanes claim."""
    LOST = "lost"
    """A claim failed in flight: its jobs may run under this worker's name, held by
    nobody here. They are given back before the next claim."""
    GIVING_BACK = "giving back"
    """A lane gives them back now; the other lane waits."""


class Lane:
    """One claim connection and where its claims stand."""

    def __init__(self, link: Link | None, lead: bool, reconnect_max: float = 10.0) -> None:
        self._link = link
        self.lead = lead
        """The first lane; the second claims only ahead of fast jobs."""
        self.state = LaneState.CLAIMING
        self.asked = 0
        """Jobs asked for by this lane's claim in flight."""
        self.backoff = Backoff(most=reconnect_max)

    @property
    def link(self) -> Link:
        assert self._link is not None
        return self._link

    @property
    def waits_for_notify(self) -> bool:
        """Its (next or current) claim waits for a NOTIFY in its I/O thread."""
        return self.lead and self.state is LaneState.IDLE

    @property
    def carries_outcomes(self) -> bool:
        return not self.waits_for_notify and self.state is not LaneState.REFUSED


class ClaimLoop:
    def __init__(
        self,
        settings: WorkerSettings,
        types: Sequence[str],
        attempts: Attempts,
        outcomes: OutcomeBuffer,
        slots: Slots,
        stopping: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.types = list(types)
        self.floor = Floor(self.types)
        """Where each priority's claim starts (the floor probe lowers it)."""
        self.attempts = attempts
        self.outcomes = outcomes
        self.slots = slots
        self._stopping = stopping
        self._parked: asyncio.Future[None] | None = None
        self.jobs_notified = threading.Event()
        """Set by the listener thread when a job that can run now was enqueued (and
        when the worker stops): an idle claim waits for it."""
        self._claims_closed = False
        """The worker stops, or the lanes are done: an idle claim still waiting for a
        NOTIFY returns without claiming."""
        self.ready = False
        """The database answered the last claim."""
        self.recovery = Recovery.NONE
        """Whether the jobs of a claim whose answer was lost are still to give back."""
        self._lead = Lane(None, lead=True)
        self._lanes: list[Lane] = []
        self.last_tick = time.monotonic()
        """When the loop last turned (for /healthz)."""

    @property
    def claiming_ahead(self) -> bool:
        s = self.settings
        return s.claim_ahead and self.slots.fast_in_a_row >= s.concurrency

    def free_slots(self) -> int:
        """Jobs the next claim may take: one per slot not running or spoken for (and
        a batch more while claiming ahead), *and* the attempts held (waiting, running,
        or finished with outcomes not yet written) stay under the cap, so a fast
        queue never claims faster than it writes; one batch (the concurrency) at
        most, so that while claiming ahead the batch ahead is left to the second
        lane's claim, in flight beside the first's."""
        c = self.settings.concurrency
        ahead = c if self.claiming_ahead else 0
        asked = self._asked
        attempts = self.attempts
        taken = attempts.slots_taken + len(attempts.waiting_for_a_slot) + asked
        return min(c + ahead - taken, self._cap() - len(attempts) - asked, c)

    def _cap(self) -> int:
        """Most attempts held at once: twice the concurrency; while claiming ahead,
        a batch more waiting and a batch more of outcomes to carry."""
        c = self.settings.concurrency
        return 2 * c + (2 * c if self.claiming_ahead else 0)

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
        self._claims_closed = True
        self.jobs_notified.set()

    # -- the loop ---------------------------------------------------------------
    async def run(self, link: Link, ahead: Link | None = None) -> None:
        """Claim until the worker stops: on `link`, and while claiming ahead also on
        `ahead`, so that two claims can be in flight, each on its own connection."""
        most = self.settings.reconnect_max_seconds
        self._lead = Lane(link, lead=True, reconnect_max=most)
        lanes = [self._lead]
        if ahead is not None and self.settings.claim_ahead:
            lanes.append(Lane(ahead, lead=False, reconnect_max=most))
        self._lanes = lanes
        tasks = [asyncio.create_task(self._claim_and_carry(lane)) for lane in lanes]
        try:
            await asyncio.gather(*tasks)
        finally:
            self.end_idle_wait()
            for task in tasks:  # one lane failed: the other stops too
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.outcomes.carry(False)
            self.slots.start_waiting()
        if self.recovery is not Recovery.NONE:
            await self._give_back_lost_claim_at_stop(link)

    @property
    def _asked(self) -> int:
        """Jobs asked for by the claims in flight."""
        return sum(lane.asked for lane in self._lanes)

    async def _claim_and_carry(self, lane: Lane) -> None:
        while not self._stopping.is_set():
            self.last_tick = time.monotonic()
            self.slots.give_back_stale()
            if not await self._ready_to_claim(lane):
                continue
            free = self.free_slots()
            if free <= 0:
                await self._wait_for_a_slot()
                continue
            await self._claim(lane, free)

    async def _ready_to_claim(self, lane: Lane) -> bool:
        """Whether `lane` claims on this turn; if not, it has waited (or given back
        the jobs of a lost claim) and the loop turns again."""
        poll = self.settings.poll_interval_seconds
        if self.recovery is Recovery.GIVING_BACK:  # the other lane does it
            await self._park(poll)
            return False
        if self.recovery is Recovery.LOST:
            try:
                await self._give_back_lost_claim(lane.link)
            except (DatabaseUnavailable, DatabaseError) as exc:
                # Away or refused: tried again after a wait, as a claim is.
                await self._wait_after(exc, lane.backoff)
                return False
        if not lane.lead and not self._worth_claiming_ahead():
            # The second lane claims only ahead of fast jobs, beside a claim in
            # flight on the first (so an idle worker polls on one lane).
            await self._park(poll)
            return False
        return True

    def _worth_claiming_ahead(self) -> bool:
        lead = self._lead
        return self.claiming_ahead and lead.asked > 0 and not lead.waits_for_notify

    async def _wait_for_a_slot(self) -> None:
        """Slots full of running attempts: the next to end frees one and its outcome
        goes with the claim that fills it. Outcomes already waiting, or too many
        held, are written by the buffer meanwhile, unless a claim is in flight: its
        lane carries them when it is back."""
        self.outcomes.carry(self._asked > 0 or (not self.outcomes.pending and self._under_cap()))
        await self._park(AHEAD_MAX_WAIT_SECONDS if self.attempts.waiting_for_a_slot else None)

    async def _claim(self, lane: Lane, free: int) -> None:
        """One claim of up to `free` jobs on `lane`, carrying a batch of outcomes unless
        the lane's claim waits for a NOTIFY or follows a refusal (the buffer writes
        them meanwhile)."""
        carries = lane.carries_outcomes
        self.outcomes.carry(carries)
        batch = self.outcomes.take() if carries else []
        if not lane.waits_for_notify:
            self.jobs_notified.clear()
        lane.asked = free
        try:
            written, jobs = await self._send_claim(lane, free, batch)
        except DatabaseUnavailable as exc:
            self.outcomes.restore(batch)
            await self._after_outage(lane, exc)
            return
        except DatabaseError as exc:
            await self._after_refusal(lane, batch, exc)
            return
        except BaseException:
            self.outcomes.restore(batch)
            raise
        finally:
            lane.asked = 0
        await self._after_answer(lane, free, batch, written, jobs)

    async def _send_claim(
        self, lane: Lane, free: int, batch: list[Execution]
    ) -> tuple[dict[Key, Status], list[Job]]:
        if lane.waits_for_notify:
            return await lane.link.run(self._claim_when_notified, free)
        s = self.settings
        since, generation = self.floor.bounds()
        written, jobs = await lane.link.run(
            claims.write_and_claim,
            s.worker_id,
            self.outcomes.to_write(batch),
            free,
            s.lease_seconds,
            self.types,
            None,
            since,
        )
        self.floor.claimed(jobs, generation)
        return written, jobs

    async def _after_outage(self, lane: Lane, exc: DatabaseUnavailable) -> None:
        """The claim failed in flight: the database may have committed it, and its
        jobs run under this worker's name with nobody here holding them."""
        self.outcomes.carry(False)
        self.ready = False
        self.recovery = Recovery.LOST
        if lane.state is LaneState.IDLE:
            lane.state = LaneState.CLAIMING  # the next claim goes at once, notified or not
        await self._wait_after(exc, lane.backoff)

    async def _after_refusal(self, lane: Lane, batch: list[Execution], exc: DatabaseError) -> None:
        self.outcomes.carry(False)
        if batch:
            # Perhaps one outcome the database cannot take: the buffer writes
            # them one at a time, and this lane claims without them.
            self.outcomes.refused(batch, exc)
            return
        # The claim alone was refused: the worker's role lost a grant, say.
        # Attempts running go on and the buffer writes their outcomes; claims
        # wait, not ready, and try again.
        self.ready = False
        lane.state = LaneState.REFUSED
        await self._wait_after(exc, lane.backoff)

    async def _after_answer(
        self,
        lane: Lane,
        free: int,
        batch: list[Execution],
        written: dict[Key, Status],
        jobs: list[Job],
    ) -> None:
        """Hold and start what came back, settle the outcomes it carried."""
        self.ready = True
        lane.backoff.reset()
        self.slots.hold(jobs)
        self.slots.start_waiting()
        if batch:
            with contextlib.suppress(DatabaseUnavailable):
                await self.outcomes.settle(lane.link, batch, written)
        idle = len(jobs) < free
        lane.state = LaneState.IDLE if idle else LaneState.CLAIMING
        if not idle:
            return
        # The queue is empty: the lead lane's next claim waits for a NOTIFY or the
        # poll interval, the second lane for an attempt to end.
        self.outcomes.carry(False)
        if not lane.lead:
            await self._park(self.settings.poll_interval_seconds)
        elif jobs:
            # The attempts just started take their first step before the next
            # claim is handed to an I/O thread, whose wake-up would take the
            # interpreter from them (a tenth of a millisecond of an idle
            # worker's enqueue-to-start time).
            await asyncio.sleep(0)

    def _claim_when_notified(self, conn: Conn, limit: int) -> tuple[dict[Key, Status], list[Job]]:
        """In the lead lane's I/O thread: wait for a NOTIFY of a job that can run now
        (or the poll interval), then claim at once. The listener thread wakes this
        thread directly: the event loop and a thread hand-off are not in between,
        which takes about a tenth of the enqueue-to-start time off an idle worker."""
        self.jobs_notified.wait(self.settings.poll_interval_seconds)
        self.jobs_notified.clear()
        if self._claims_closed:
            return {}, []
        s = self.settings
        since, generation = self.floor.bounds()
        jobs = claims.claim(conn, s.worker_id, limit, s.lease_seconds, self.types, None, since)
        self.floor.claimed(jobs, generation)
        return {}, jobs

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
        self.recovery = Recovery.GIVING_BACK
        try:
            while self._asked:
                await asyncio.sleep(0.01)
            running = await link.run(claims.running_of, self.settings.worker_id)
            lost = [
                Attempt(job_id, attempts, Outcome.RELEASED)
                for job_id, attempts in running
                if not self.attempts.holds((job_id, attempts))
            ]
            if lost:
                written = await link.run(claims.write_outcomes, self.settings.worker_id, lost)
                log.warning(
                    "%d jobs of a claim whose answer was lost given back: %s",
                    len(written),
                    ", ".join(str(job_id) for job_id, _ in sorted(written)),
                )
            self.recovery = Recovery.NONE
        finally:
            if self.recovery is Recovery.GIVING_BACK:  # failed: still to do
                self.recovery = Recovery.LOST
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
        return len(self.attempts) < self._cap()
