"""The outcome buffer: finished attempts wait here until written, in batches.

Outcomes are written by one statement per batch, each conditional on the
lease. While the database is away they stay in memory and are written when it
is back (an outage costs no attempt and loses no completion); so do they while
the database refuses their write for a reason that passes (a lock not had in
time, a statement timeout, a deadlock: `rota.db.is_passing`). An outcome the
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

from rota import claim as claims
from rota import db
from rota.attempt import Attempt, Key
from rota.errors import DatabaseError, DatabaseUnavailable, one_line
from rota.jobs import Outcome, Status
from rota.metrics import record_outcomes
from rota_worker.attempts import Attempts, Event, Execution, State
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
        attempts: Attempts,
        reconnect_max_seconds: float = 10.0,
    ) -> None:
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.attempts = attempts
        self._reconnect_max = reconnect_max_seconds
        self.pending: list[Execution] = []
        """ENDED records whose outcome waits for a writer, oldest first."""
        self._alone: list[Execution] = []
        """Records of a batch the database refused: written one per statement, so
        that one it cannot take holds back no other; never carried by a claim."""
        self.wake = asyncio.Event()
        self._released = asyncio.Event()
        """Clear while the claim loop takes pending outcomes along with its next claim."""
        self._released.set()

    @property
    def unsettled(self) -> int:
        """Outcomes not accounted for yet: the ENDED records (pending, or being written)."""
        return self.attempts.count(State.ENDED)

    @property
    def written(self) -> int:
        """Attempts accounted for so far (written, given back or lost)."""
        return self.attempts.settled_total

    def add(self, record: Execution) -> None:
        """An ENDED record: its outcome is to be written."""
        self.pending.append(record)
        self.wake.set()

    def carry(self, on: bool) -> None:
        """The claim loop says whether its next claim, due at once, takes the
        pending outcomes along (True), or it waits for work (False): then this
        buffer writes them itself."""
        if on:
            self._released.clear()
        else:
            self._released.set()

    def take(self) -> list[Execution]:
        """The oldest batch, handed to a writer; `settle` or `restore` it after."""
        batch = self.pending[: self.batch_size]
        del self.pending[: len(batch)]
        return batch

    def restore(self, batch: list[Execution]) -> None:
        """A batch whose write failed: nothing of it was written; it waits again, first.
        (Outcomes are restored to the buffer; a job is *given back* to the database.)"""
        self.pending[:0] = batch
        if batch:
            self.wake.set()

    def refused(self, batch: list[Execution], exc: DatabaseError) -> None:
        """A batch whose write the database refused (not an outage): nothing of it was
        written; its outcomes are written again one at a time."""
        log.warning(
            "the database refused a batch of %d outcomes (%s); writing them one at a time",
            len(batch),
            one_line(exc),
        )
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
                except (DatabaseUnavailable, DatabaseError) as exc:
                    # Away, or refused for a reason that passes: what was not
                    # written waits, and is tried again after the wait.
                    delay = backoff.next()
                    log.warning(
                        "%d outcomes wait for the database (%s); retry in %.1fs",
                        len(self.pending) + len(self._alone),
                        one_line(exc),
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()

    @staticmethod
    def to_write(batch: list[Execution]) -> list[Attempt]:
        """The outcomes of `batch` that have something to write (a lost lease has not,
        nor has a job its run suspended)."""
        return [a for a in map(_outcome, batch) if a.outcome not in _NOTHING_TO_WRITE]

    async def flush(self, link: Link) -> None:
        """Write one batch on its own and account for every attempt in it."""
        batch = self.take()
        try:
            written = await link.run(claims.write_outcomes, self.worker_id, self.to_write(batch))
        except DatabaseError as exc:
            if db.is_passing(exc):
                self.restore(batch)
                raise  # tried again as it is, after a wait
            self.refused(batch, exc)
            return
        except BaseException:
            self.restore(batch)
            raise
        await self.settle(link, batch, written)

    async def _write_alone(self, link: Link) -> None:
        """Write the first refused outcome in a statement of its own. One the database
        refuses again, for a reason about the outcome itself (a value it cannot
        take), is given up: nothing is written, the lease is let go, and the job
        runs again once it expires (the reaper counts the attempt). A refusal that
        passes keeps it, to be tried again after a wait."""
        record = self._alone.pop(0)
        attempt = _outcome(record)
        try:
            written = await link.run(claims.write_outcomes, self.worker_id, self.to_write([record]))
        except DatabaseError as exc:
            if db.is_passing(exc):
                self._alone.insert(0, record)
                raise
            log.error(
                "job %s (%s) attempt %d: the database refused its outcome (%s: %s);"
                " nothing written, the job runs again when its lease expires",
                attempt.job_id,
                attempt.type,
                attempt.attempts,
                attempt.outcome,
                one_line(exc),
            )
            self.attempts.dispatch(record, Event.LOST)
            _count([record], [Outcome.LEASE_LOST])
            return
        except BaseException:
            self._alone.insert(0, record)
            raise
        await self.settle(link, [record], written)

    async def settle(self, link: Link, batch: list[Execution], written: dict[Key, Status]) -> None:
        """Account for a batch whose write committed (`written`: what the database took)."""
        unwritten = [a for a in self.to_write(batch) if a.key not in written]
        try:
            lost = await self._lost(link, unwritten)
        except BaseException:
            # Those written are settled; the others are looked at again later
            # (rewriting them changes nothing: their lease is not held).
            again = {a.key for a in unwritten}
            done = [r for r in batch if r.key not in again]
            _count(done, [self._account(r, written.get(r.key), False) for r in done])
            self.restore([r for r in batch if r.key in again])
            raise
        _count(batch, [self._account(r, written.get(r.key), r.key in lost) for r in batch])

    async def _lost(self, link: Link, unwritten: list[Attempt]) -> set[Key]:
        """Keys among `unwritten` whose lease was really lost (not self-completed)."""
        if not unwritten:
            return set()
        states = await link.run(claims.states, [a.job_id for a in unwritten])
        lost = set()
        completed = []
        for attempt in unwritten:
            row = states.get(attempt.job_id)
            self_completed = (
                row is not None
                and row["status"] == Status.DONE
                and row["locked_by"] == self.worker_id
                and row["claims"] == attempt.claim
            )
            if self_completed:
                completed.append(attempt)
            else:
                lost.add(attempt.key)
        if any(a.result is not None for a in completed):
            # What those handlers returned is kept, as any other handler's.
            await link.run(claims.store_results, self.worker_id, completed)
        return lost

    def _account(self, record: Execution, status: Status | None, lost: bool) -> Outcome:
        attempt = _outcome(record)
        outcome = _final(attempt, status, lost)
        _log_final(attempt, outcome)
        self.attempts.dispatch(record, _EVENT_OF.get(outcome, Event.WRITTEN))
        return outcome


_EVENT_OF = {
    Outcome.LEASE_LOST: Event.LOST,
    Outcome.RELEASED: Event.GIVEN_BACK,
    Outcome.WAITING: Event.SUSPENDED,
}
"""How a record is settled, by its final outcome (any other: WRITTEN)."""


def _log_final(attempt: Attempt, outcome: Outcome) -> None:
    """One line per settled outcome: a warning for what went wrong, else debug."""
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


def _outcome(record: Execution) -> Attempt:
    """The outcome of an ENDED record."""
    assert record.outcome is not None, record
    return record.outcome


def _count(batch: list[Execution], outcomes: list[Outcome]) -> None:
    """Metrics for a settled batch, counted once per batch."""
    record_outcomes(
        (a.type, outcome, a.duration_seconds, a.attempts)
        for a, outcome in zip(map(_outcome, batch), outcomes, strict=True)
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
