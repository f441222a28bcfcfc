"""What a job is: the row a handler receives, and the statuses it moves through.

Standard library only: this module is the vocabulary, not the machinery.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime
from typing import Any


class Status(enum.StrEnum):
    READY = "ready"
    """Waiting to run: new, or a retry waiting for run_at."""
    RUNNING = "running"
    """Claimed by a worker that holds the lease until locked_until."""
    DONE = "done"
    """The handler succeeded."""
    FAILED = "failed"
    """The handler raised a permanent error; not retried."""
    DEAD = "dead"
    """max_attempts reached: the dead-letter list."""


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """One job as a handler sees it (a snapshot of its row at claim time)."""

    id: int
    type: str
    payload: Any
    idempotency_key: str | None
    status: Status
    run_at: datetime
    attempts: int
    max_attempts: int
    locked_by: str | None = None
    locked_until: datetime | None = None
    last_error: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    schedule_id: int | None = None
    slot: datetime | None = None

    @property
    def effect_key(self) -> str:
        """A stable key to hand to external systems: the same on every attempt.

        The job's idempotency key when it has one, otherwise one derived from its id.
        """
        return self.idempotency_key or f"rota-job:{self.id}"

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in row.items() if k in fields}
        values["status"] = Status(values["status"])
        return cls(**values)


@dataclasses.dataclass(frozen=True, slots=True)
class NewJob:
    """A job to enqueue (see `rota.enqueue_many`)."""

    type: str
    payload: Any = None
    key: str | None = None
    run_at: datetime | None = None
    delay: float | None = None
    max_attempts: int | None = None
