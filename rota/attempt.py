"""What a worker and the database say to each other about one attempt.

`Attempt` is how an attempt ended, as its worker saw it (what to write);
`Lease` is what a lease renewal answered. They are shared by the SQL gateway
(`rota.claim`), the handlers' own completion (`rota.complete`) and the worker.
Standard library only, no SQL: the vocabulary, not the machinery.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rota.jobs import Job, Outcome

Key = tuple[int, int]
"""(job id, claim number): one attempt of one job in the database.

The claim's number (`Job.claims`), not the attempt's: nothing lowers it, so a
run whose lease was taken away never holds the key of a later claim, even by
the same worker at the same attempt number (migration 0041)."""


def key_of(job: Job) -> Key:
    """The key of the attempt a claim of `job` started."""
    return (job.id, job.claims)


@dataclasses.dataclass(slots=True)
class Attempt:
    """How one attempt of a job ended, as its worker saw it: what to write.

    Never changed once built (`dataclasses.replace` makes another), yet not
    frozen: a frozen dataclass sets each field through object.__setattr__, and
    one Attempt is built per job (2.3 us against 0.6 here)."""

    job_id: int
    attempts: int
    """The attempt number the worker claimed (for logs and measures)."""
    outcome: Outcome
    """DONE, RETRY, DEAD, FAILED, RELEASED or CANCELLED: what the run decided."""
    delay: float = 0.0
    """Seconds before a retried or released job may run again."""
    error: str | None = None
    type: str = ""
    """The job's type, for logs and metrics (not written)."""
    duration_seconds: float = 0.0
    """How long the handler ran (not written)."""
    result: str | None = None
    """The handler's return value as JSON text (None when it returned None)."""
    claim: int = 0
    """The number of the claim that started the attempt: its lease is tied to it."""

    @classmethod
    def of(
        cls, job: Job, outcome: Outcome, delay: float = 0.0, error: str | None = None, **rest: Any
    ) -> Attempt:
        """How the attempt a claim of `job` started ended."""
        return cls(job.id, job.attempts, outcome, delay, error, claim=job.claims, **rest)

    @property
    def key(self) -> Key:
        """(job id, claim number): one attempt of one job, never confused with another."""
        return (self.job_id, self.claim)


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """A lease the renewal extended."""

    job_id: int
    claim: int
    """The number of the claim whose lease was extended."""
    cancel_requested: bool
    """Somebody asked to cancel the job: its handler should stop."""
