"""The jobs of a claim whose answer was lost: given back before claims go on.

A claim that failed in flight (the connection broke after the database may have
committed it) leaves jobs running under this worker's name that nobody here
holds. Claims stop; a claim still in flight on the other lane is waited for
(once answered, its jobs are held, never taken for lost ones); then the rows
running under this worker's name that it does not hold are given back, their
attempt not counted, without waiting for a lease to expire.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable

from rota import claim as claims
from rota.errors import DatabaseError, DatabaseUnavailable
from rota_worker.attempts import Attempts
from rota_worker.link import Link

log = logging.getLogger("rota.worker")

STOP_GIVE_BACK_SECONDS = 5.0
"""How long a stopping worker tries to give back the jobs of a lost claim."""


class Recovery(enum.StrEnum):
    """The jobs of a claim whose answer was lost (the claim may have committed)."""

    NONE = "none"
    """Nothing to give back: lanes claim."""
    LOST = "lost"
    """A claim failed in flight: its jobs may run under this worker's name, held by
    nobody here. They are given back before the next claim."""
    GIVING_BACK = "giving back"
    """A lane gives them back now; the other lane waits."""


class LostClaim:
    """Whether a lost claim's jobs are still to give back, and the giving back."""

    def __init__(self, worker_id: str, attempts: Attempts, wake: Callable[[], None]) -> None:
        self.worker_id = worker_id
        self.attempts = attempts
        self._wake = wake
        """Resumes the claim loop (the giving back is over, done or not)."""
        self.state = Recovery.NONE
        self._no_claim_in_flight = asyncio.Event()
        self._no_claim_in_flight.set()

    def lost(self) -> None:
        """A claim failed in flight: its jobs are to give back."""
        self.state = Recovery.LOST

    def in_flight(self, asked: int) -> None:
        """The claim loop's jobs asked for by claims in flight, now."""
        if asked:
            self._no_claim_in_flight.clear()
        else:
            self._no_claim_in_flight.set()

    async def give_back(self, link: Link) -> None:
        """Give back the jobs of a claim whose answer was lost: the rows running under
        this worker's name that it does not hold. Their attempt is not counted, and
        they wait for no lease to expire.

        Claims stop meanwhile, and a claim in flight on the other lane is waited
        for first (an idle one returns at its NOTIFY or its poll interval): once
        answered, its jobs are held, never taken for lost ones."""
        self.state = Recovery.GIVING_BACK
        try:
            await self._no_claim_in_flight.wait()
            running = await link.run(claims.running_of, self.worker_id)
            lost = [attempt for attempt in running if not self.attempts.holds(attempt.key)]
            if lost:
                written = await link.run(claims.write_outcomes, self.worker_id, lost)
                log.warning(
                    "%d jobs of a claim whose answer was lost given back: %s",
                    len(written),
                    ", ".join(str(job_id) for job_id, _ in sorted(written)),
                )
            self.state = Recovery.NONE
        finally:
            if self.state is Recovery.GIVING_BACK:  # failed: still to do
                self.state = Recovery.LOST
            self._wake()

    async def give_back_at_stop(self, link: Link) -> None:
        """The worker stops with the jobs of a lost claim not given back yet: one
        try, so that they need not wait for their lease (which would count their
        attempt). If the database is still away (or too slow to answer within
        `STOP_GIVE_BACK_SECONDS`, which the shutdown's grace must not wait for),
        the lease is all there is."""
        try:
            await asyncio.wait_for(self.give_back(link), STOP_GIVE_BACK_SECONDS)
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
