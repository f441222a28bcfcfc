"""The claim loop: claims into free slots, carrying the pending outcomes along.

It claims as many jobs as there are free slots, in one statement, and writes
the outcomes waiting in the buffer in the same transaction (one round trip, one
commit per batch). When the queue is empty it waits for a NOTIFY or the poll
interval; when every slot is busy it waits for one to be freed, and lets the
outcome buffer write on its own meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from rota import claim as claims
from rota.errors import DatabaseUnavailable
from rota.jobs import Job
from rota_worker.leases import LeaseKeeper
from rota_worker.link import Backoff, Link, first
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.settings import WorkerSettings

log = logging.getLogger("rota.worker")


class ClaimLoop:
    def __init__(
        self,
        settings: WorkerSettings,
        types: Sequence[str],
        leases: LeaseKeeper,
        outcomes: OutcomeBuffer,
        start: Callable[[Job], None],
        stopping: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.types = list(types)
        self.leases = leases
        self.outcomes = outcomes
        self._start = start
        self._stopping = stopping
        self.slot_freed = asyncio.Event()
        """Set whenever an attempt ends or its outcome is settled."""
        self.jobs_notified = asyncio.Event()
        """Set by the listener when a job that can run now was enqueued."""
        self.ready = False
        """The database answered the last claim."""
        self.last_tick = time.monotonic()
        """When the loop last turned (for /healthz)."""

    def free_slots(self) -> int:
        """Slots free for new claims: a job can start, *and* the attempts held
        (running, or finished with outcomes not yet written) stay under twice
        the concurrency, so a fast queue never claims faster than it writes."""
        s = self.settings
        return min(s.concurrency - len(self.leases.running), 2 * s.concurrency - len(self.leases))

    async def run(self, link: Link) -> None:
        """Claim until the worker stops."""
        try:
            await self._claim_and_carry(link)
        finally:
            self.outcomes.carry(False)

    async def _claim_and_carry(self, link: Link) -> None:
        backoff = Backoff(most=self.settings.reconnect_max_seconds)
        s = self.settings
        while not self._stopping.is_set():
            self.last_tick = time.monotonic()
            free = self.free_slots()
            if free <= 0:
                # Slots full of running attempts: the next to end frees one and its
                # outcome goes with the claim that fills it. Outcomes already
                # waiting, or too many held, are written by the buffer meanwhile.
                self.outcomes.carry(not self.outcomes.pending and self._under_cap())
                self.slot_freed.clear()
                await first(self.slot_freed, self._stopping)
                continue
            self.outcomes.carry(True)
            self.jobs_notified.clear()
            batch = self.outcomes.take()
            try:
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
                delay = backoff.next()
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                await first(self._stopping, timeout=delay)
                continue
            except BaseException:
                self.outcomes.give_back(batch)
                raise
            self.ready = True
            backoff.reset()
            if batch:
                with contextlib.suppress(DatabaseUnavailable):
                    await self.outcomes.settle(link, batch, written)
            for job in jobs:
                self._start(job)
            if len(jobs) < free:
                self.outcomes.carry(False)
                await first(self.jobs_notified, self._stopping, timeout=s.poll_interval_seconds)

    def _under_cap(self) -> bool:
        return len(self.leases) < 2 * self.settings.concurrency
