"""The outcome buffer: finished attempts wait here until written, in batches.

Outcomes are written by one statement per batch, each conditional on the
lease. While the database is away they stay in memory and are written when it
is back (an outage costs no attempt and loses no completion). An outcome the
database did not take means the lease was lost, with one benign exception: the
handler completed its own job in its own transaction (`rota.complete`), so the
row is already done by this worker at this attempt.

In steady state the claim loop carries the outcomes: it takes a batch and
writes it in the transaction of its next claim (one round trip, one commit),
and settles it here. The buffer's own loop writes only when the claim loop is
not about to claim (the queue is empty, the slots are full, or the database
is away), so an outcome never waits for work to come in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from rota import claim as claims
from rota.claim import Attempt
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.jobs import Outcome, Status
from rota.metrics import record_outcomes
from rota_worker.attempts import State
from rota_worker.link import Backoff, Link

log = logging.getLogger("rota.worker")

_WORTH_A_WARNING = frozenset({Outcome.RETRY, Outcome.DEAD, Outcome.FAILED})

_NOTHING_TO_WRITE = frozenset({Outcome.LEASE_LOST, Outcome.WAITING})
"""Outcomes with nothing left to write: a lost lease, and a job its run suspended
(rota.durable wrote it waiting, conditional on the lease, before the attempt ended)."""


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
        self._alone: list[Attempt] = []
        """Outcomes of a batch the database refused: written one per statement, so
        that one it cannot take holds back no other; never carried by a claim."""
        self._in_flight = 0
        self.wake = asyncio.Event()
        self._released = asyncio.Event()
        """Clear while the claim loop takes pending outcomes along with its next claim."""
        self._released.set()
        self.written = 0
        """Attempts accounted for so far (written, self-completed or lost)."""

    @property
    def unsettled(self) -> int:
        """Outcomes not accounted for yet: pending, or being written right now."""
        return len(self.pending) + len(self._alone) + self._in_flight

    def add(self, attempt: Attempt) -> None:
        self.pending.append(attempt)
        self.wake.set()

    def carry(self, on: bool) -> None:
        """The claim loop says whether its next claim, due at once, takes the
        pending outcomes along (True), or it waits for work (False): then this
        buffer writes them itself."""
        if on:
            self._released.clear()
        else:
            self._released.set()

    def take(self) -> list[Attempt]:
        """The oldest batch, handed to a writer; `settle` or `restore` it after."""
        batch = self.pending[: self.batch_size]
        del self.pending[: len(batch)]
        self._in_flight += len(batch)
        return batch

    def restore(self, batch: list[Attempt]) -> None:
        """A batch whose write failed: nothing of it was written; it waits again, first.
        (Outcomes are restored to the buffer; a job is *given back* to the database.)"""
        self._in_flight -= len(batch)
        self.pending[:0] = batch
        if batch:
            self.wake.set()

    def refused(self, batch: list[Attempt], exc: DatabaseError) -> None:
        """A batch whose write the database refused (not an outage): nothing of it was
        written; its outcomes are written again one at a time."""
        log.warning(
            "the database refused a batch of %d outcomes (%s); writing them one at a time",
            len(batch),
            exc,
        )
        self._in_flight -= len(batch)
        self._alone.extend(batch)
        if batch:
            self.wake.set()

    async def run(self, link: Link) -> None:
        """Write what is pending whenever woken, unless the claim loop carries it."""
        backoff = Backoff(most=self._reconnect_max)
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.pending or self._alone:
                if not self._alone and not self._released.is_set():
                    await self._released.wait()
                    continue
                try:
                    if self._alone:
                        await self._write_alone(link)
                    else:
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

    @staticmethod
    def to_write(batch: list[Attempt]) -> list[Attempt]:
        """The attempts of `batch` that have something to write (a lost lease has not)."""
        return [a for a in batch if a.outcome not in _NOTHING_TO_WRITE]

    async def flush(self, link: Link) -> None:
        """Write one batch on its own and account for every attempt in it."""
        batch = self.take()
        try:
            written = await link.run(claims.write_outcomes, self.worker_id, self.to_write(batch))
        except DatabaseError as exc:
            self.refused(batch, exc)
            return
        except BaseException:
            self.restore(batch)
            raise
        await self.settle(link, batch, written)

    async def _write_alone(self, link: Link) -> None:
        """Write the first refused outcome in a statement of its own. One the database
        refuses again is given up: nothing is written, the lease is let go, and the
        job runs again once it expires (the reaper counts the attempt)."""
        attempt = self._alone.pop(0)
        self._in_flight += 1
        try:
            written = await link.run(
                claims.write_outcomes, self.worker_id, self.to_write([attempt])
            )
        except DatabaseError as exc:
            self._in_flight -= 1
            log.error(
                "job %s (%s) attempt %d: the database refused its outcome (%s: %s);"
                " nothing written, the job runs again when its lease expires",
                attempt.job_id,
                attempt.type,
                attempt.attempts,
                attempt.outcome,
                exc,
            )
            self._settle_one(attempt, State.LOST)
            _count([attempt], [Outcome.LEASE_LOST])
            return
        except BaseException:
            self._in_flight -= 1
            self._alone.insert(0, attempt)
            raise
        await self.settle(link, [attempt], written)

    async def settle(
        self, link: Link, batch: list[Attempt], written: dict[tuple[int, int], Status]
    ) -> None:
        """Account for a batch whose write committed (`written`: what the database took)."""
        unwritten = [a for a in self.to_write(batch) if a.key not in written]
        try:
            lost = await self._lost(link, unwritten)
        except BaseException:
            # Those written are settled; the others are looked at again later
            # (rewriting them changes nothing: their lease is not held).
            again = {a.key for a in unwritten}
            self._in_flight -= len(batch) - len(unwritten)
            done = [a for a in batch if a.key not in again]
            _count(done, [self._account(a, written.get(a.key), False) for a in done])
            self.restore(unwritten)
            raise
        self._in_flight -= len(batch)
        _count(batch, [self._account(a, written.get(a.key), a.key in lost) for a in batch])

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

    def _account(self, attempt: Attempt, status: Status | None, lost: bool) -> Outcome:
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
        self._settle_one(attempt, _STATE_OF.get(outcome, State.WRITTEN))
        return outcome

    def _settle_one(self, attempt: Attempt, state: State) -> None:
        """The attempt's outcome is accounted for: its record moves to `state`."""
        owner: Any = attempt.owner  # the worker's record (an Execution), or None
        if owner is not None:
            owner.move(state)
        self.written += 1
        self._settled(attempt)


_STATE_OF = {Outcome.LEASE_LOST: State.LOST, Outcome.RELEASED: State.GIVEN_BACK}
"""Where an attempt's record ends, by its final outcome (any other: WRITTEN)."""


def _count(batch: list[Attempt], outcomes: list[Outcome]) -> None:
    """Metrics for a settled batch, counted once per batch."""
    record_outcomes(
        (a.type, outcome, a.duration_seconds, a.attempts)
        for a, outcome in zip(batch, outcomes, strict=True)
    )


def _final(attempt: Attempt, status: Status | None, lost: bool) -> Outcome:
    """What became of an attempt once the database had its say."""
    if lost or attempt.outcome is Outcome.LEASE_LOST:
        return Outcome.LEASE_LOST
    if attempt.outcome is Outcome.WAITING:
        return Outcome.WAITING  # written by the run itself
    if status is None:
        return Outcome.DONE  # completed by the handler in its own transaction
    if status is Status.DEAD:
        return Outcome.DEAD
    if status is Status.CANCELLED:
        return Outcome.CANCELLED
    return attempt.outcome
