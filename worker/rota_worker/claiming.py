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
import functools
import logging
import time
from collections.abc import Sequence

from rota.attempt import Key
from rota.db import is_passing
from rota.errors import DatabaseError, DatabaseUnavailable, one_line
from rota.jobs import Job, Status
from rota_worker.attempts import Attempts, Execution
from rota_worker.lanes import Claims, Lane, LaneState
from rota_worker.link import Backoff, Link, first
from rota_worker.loops import Wakeup
from rota_worker.lost_claims import LostClaim, Recovery
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.settings import WorkerSettings
from rota_worker.slots import AHEAD_MAX_WAIT_SECONDS, Slots

log = logging.getLogger("rota.worker")


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
        self.statements = Claims(settings, types)
        self.floor = self.statements.floor
        self.jobs_notified = self.statements.jobs_notified
        self.attempts = attempts
        self.outcomes = outcomes
        self.slots = slots
        self._stopping = stopping
        self._wakeup = Wakeup()
        self.wake = self._wakeup.set
        """Resume the loop waiting for a slot (an attempt ended or settled, a stop)."""
        self._park = self._wakeup.wait
        self.ready = False
        """The database answered the last claim."""
        self.lost_claim = LostClaim(settings.worker_id, attempts, self.wake)
        """The jobs of a claim whose answer was lost, still to give back (or not)."""
        self._wait_after = functools.partial(wait_after, stopping=stopping)
        self._lead = Lane(None, lead=True)
        self._lanes: list[Lane] = []
        self.last_tick = time.monotonic()
        """When the loop last turned (for /healthz)."""

    @property
    def claiming_ahead(self) -> bool:
        return self.slots.claiming_ahead

    def free_slots(self) -> int:
        """Jobs the next claim may take (see `Slots.claimable`)."""
        return self.slots.claimable(self._asked)

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
            self.statements.end_idle_wait()
            for task in tasks:  # one lane failed: the other stops too
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.outcomes.carry(False)
            self.slots.start_waiting()
        if self.lost_claim.state is not Recovery.NONE:
            await self.lost_claim.give_back_at_stop(link)

    @property
    def _asked(self) -> int:
        """Jobs asked for by the claims in flight."""
        return sum(lane.asked for lane in self._lanes)

    def _asking(self, lane: Lane, jobs: int) -> None:
        """`lane`'s claim in flight asks for `jobs` (0: answered)."""
        lane.asked = jobs
        self.lost_claim.in_flight(self._asked)

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
        if self.lost_claim.state is Recovery.GIVING_BACK:  # the other lane does it
            await self._park(poll)
            return False
        if self.lost_claim.state is Recovery.LOST:
            try:
                await self.lost_claim.give_back(lane.link)
            except (DatabaseUnavailable, DatabaseError) as exc:
                # Away or refused: tried again after a wait, as a claim is.
                await self._wait_after(exc, lane.backoff)
                return False
        lead = self._lead
        ahead = self.claiming_ahead and lead.asked > 0 and not lead.waits_for_notify
        if not lane.lead and not ahead:
            # The second lane claims only ahead of fast jobs, beside a claim in
            # flight on the first (so an idle worker polls on one lane).
            await self._park(poll)
            return False
        return True

    async def _wait_for_a_slot(self) -> None:
        """Slots full of running attempts: the next to end frees one and its outcome
        goes with the claim that fills it. Outcomes already waiting, or too many
        held, are written by the buffer meanwhile, unless a claim is in flight: its
        lane carries them when it is back."""
        self.outcomes.carry(
            self._asked > 0 or (not self.outcomes.pending and self.slots.under_cap())
        )
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
        self._asking(lane, free)
        try:
            sent = self.outcomes.to_write(batch)
            written, jobs = await self.statements.send(lane, free, sent)
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
            self._asking(lane, 0)
        await self._after_answer(lane, free, batch, written, jobs)

    async def _after_outage(self, lane: Lane, exc: DatabaseUnavailable) -> None:
        """The claim failed in flight: the database may have committed it, and its
        jobs run under this worker's name with nobody here holding them."""
        self.outcomes.carry(False)
        self.ready = False
        self.lost_claim.lost()
        if lane.state is LaneState.IDLE:
            lane.state = LaneState.CLAIMING  # the next claim goes at once, notified or not
        await self._wait_after(exc, lane.backoff)

    async def _after_refusal(self, lane: Lane, batch: list[Execution], exc: DatabaseError) -> None:
        self.outcomes.carry(False)
        if batch and is_passing(exc):
            # A lock not had in time, a statement timeout, a deadlock: the same
            # outcomes go again, with a later claim or by the buffer, after a wait.
            self.outcomes.restore(batch)
            await self._wait_after(exc, lane.backoff)
            return
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


async def wait_after(
    exc: DatabaseUnavailable | DatabaseError, backoff: Backoff, stopping: asyncio.Event
) -> None:
    """The database is away (a warning) or refused the claim (an error): wait the
    next backoff step (or until the worker stops)."""
    delay = backoff.next()
    level = logging.WARNING if isinstance(exc, DatabaseUnavailable) else logging.ERROR
    log.log(level, "claim failed (%s); retrying in %.1fs", one_line(exc), delay)
    await first(stopping, timeout=delay)
