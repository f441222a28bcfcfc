"""The outcome buffer: finished attempts wait here until written, in batches.

Outcomes are written by one statement per batch, each conditional on the
lease. While the database is away they stay in memory and are written when it
is back (an outage costs no attempt and loses no completion). An outcome the
database did not take means the lease was lost, with one benign exception: the
handler completed its own job in its own transaction (`rota.complete`), so the
row is already done by this worker at this attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rota import claim as claims
from rota.claim import Attempt
from rota.errors import DatabaseUnavailable
from rota.jobs import Outcome, Status
from rota.metrics import record_outcome
from rota_worker.link import Backoff, Link

log = logging.getLogger("rota.worker")

_WORTH_A_WARNING = frozenset({Outcome.RETRY, Outcome.DEAD, Outcome.FAILED})


class OutcomeBuffer:
    def __init__(
        self,
        worker_id: str,
        batch_size: int,
        settled: Callable[[Attempt], None],
        reconnect_max_seconds: float = 10.0,
    ) -> None:
        self.worker_id = worker_id
        self.batch_size = batch_size
        self._settled = settled
        self._reconnect_max = reconnect_max_seconds
        self.pending: list[Attempt] = []
        self.wake = asyncio.Event()
        self.written = 0
        """Attempts accounted for so far (written, self-completed or lost)."""

    def add(self, attempt: Attempt) -> None:
        self.pending.append(attempt)
        self.wake.set()

    async def run(self, link: Link) -> None:
        """Write what is pending whenever woken, until cancelled."""
        backoff = Backoff(most=self._reconnect_max)
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.pending:
                try:
                    await self.flush(link)
                except DatabaseUnavailable as exc:
                    delay = backoff.next()
                    log.warning(
                        "%d outcomes wait for the database (%s); retry in %.1fs",
                        len(self.pending),
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()

    async def flush(self, link: Link) -> None:
        """Write one batch and account for every attempt in it."""
        batch = self.pending[: self.batch_size]
        to_write = [a for a in batch if a.outcome is not Outcome.LEASE_LOST]
        written = await link.run(claims.write_outcomes, self.worker_id, to_write)
        unwritten = [a for a in to_write if a.key not in written]
        lost = await self._lost(link, unwritten)
        del self.pending[: len(batch)]
        for attempt in batch:
            self._account(attempt, written.get(attempt.key), attempt.key in lost)

    async def _lost(self, link: Link, unwritten: list[Attempt]) -> set[tuple[int, int]]:
        """Keys among `unwritten` whose lease was really lost (not self-completed)."""
        if not unwritten:
            return set()
        states = await link.run(claims.states, [a.job_id for a in unwritten])
        lost = set()
        for attempt in unwritten:
            row = states.get(attempt.job_id)
            self_completed = (
                row is not None
                and row["status"] == Status.DONE
                and row["locked_by"] == self.worker_id
                and row["attempts"] == attempt.attempts
            )
            if not self_completed:
                lost.add(attempt.key)
        return lost

    def _account(self, attempt: Attempt, status: Status | None, lost: bool) -> None:
        outcome = _final(attempt, status, lost)
        if outcome is Outcome.LEASE_LOST:
            log.warning(
                "job %s (%s) attempt %d: lease lost before its outcome (%s) was written;"
                " nothing written",
                attempt.job_id,
                attempt.type,
                attempt.attempts,
                attempt.outcome,
            )
        elif outcome in _WORTH_A_WARNING:
            first_line = (attempt.error or "").splitlines()[0] if attempt.error else ""
            log.warning(
                "job %s (%s) attempt %d: %s%s",
                attempt.job_id,
                attempt.type,
                attempt.attempts,
                outcome,
                f": {first_line}" if first_line else "",
            )
        else:
            log.debug(
                "job %s (%s): %s in %.3fs",
                attempt.job_id,
                attempt.type,
                outcome,
                attempt.duration_seconds,
            )
        record_outcome(attempt.type, outcome, attempt.duration_seconds, attempt.attempts)
        self.written += 1
        self._settled(attempt)


def _final(attempt: Attempt, status: Status | None, lost: bool) -> Outcome:
    """What became of an attempt once the database had its say."""
    if lost or attempt.outcome is Outcome.LEASE_LOST:
        return Outcome.LEASE_LOST
    if status is None:
        return Outcome.DONE  # completed by the handler in its own transaction
    if status is Status.DEAD:
        return Outcome.DEAD
    if status is Status.CANCELLED:
        return Outcome.CANCELLED
    return attempt.outcome
