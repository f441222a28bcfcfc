"""What a job is: the row a handler receives, and the statuses it moves through.

Standard library only: this module is the vocabulary, not the machinery.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from datetime import datetime
from typing import Any

from rota.errors import Cancelled


class Status(enum.StrEnum):
    READY = "ready"
    """Waiting to run: new, or a retry waiting for run_at."""
    RUNNING = "running"
    """Claimed by a worker that holds the lease until locked_until."""
    WAITING = "waiting"
    """Suspended by its handler (a sleep, an event, its children): no worker holds it;
    ready again when the wait is over (docs/durable-jobs.md)."""
    DONE = "done"
    """The handler succeeded."""
    FAILED = "failed"
    """The handler raised a permanent error; not retried."""
    DEAD = "dead"
    """max_attempts reached: the dead-letter list."""
    CANCELLED = "cancelled"
    """Cancelled by an operator: terminal, never retried, archived like failed."""

    @classmethod
    def stored(cls, text: str) -> Status:
        """The status a row holds, for readers. A text that is none of these (an
        archived row older than the archive's check, migration 0039) is kept as
        stored: a member of no list, equal to its own text only, so the row is shown,
        not refused."""
        try:
            return cls(text)
        except ValueError:
            unknown = str.__new__(cls, text)
            unknown._name_ = unknown._value_ = text
            return unknown


NOT_ENDED = frozenset({Status.READY, Status.RUNNING, Status.WAITING})
"""Statuses of a job that has not ended. Any other is an end, as the database
counts a child's (`rota.children_ended`): a status no reader knows too."""


class Outcome(enum.StrEnum):
    """How one attempt of a job ended: the one word used from the worker that
    decides it, through the SQL that writes it, to the metric label that counts it."""

    DONE = "done"
    """The handler returned."""
    RETRY = "retry"
    """The handler raised (or timed out): ready again after a backoff."""
    DEAD = "dead"
    """A retry with no attempts left: written as status dead."""
    FAILED = "failed"
    """The handler raised `Permanent`, or no handler exists for the type."""
    RELEASED = "released"
    """Given back without counting the attempt (shutdown, database outage)."""
    CANCELLED = "cancelled"
    """An operator cancelled the job while it ran."""
    WAITING = "waiting"
    """The handler suspended the job (a sleep, an event, its children): written by the
    run itself (rota.durable), the attempt not counted, the slot free at once."""
    LEASE_LOST = "lease_lost"
    """The lease was gone before the outcome could be written: nothing written."""


class StopSignal:
    """Whether an attempt should stop: the methods of `threading.Event`, and as
    safe across threads, with the event itself made only when somebody waits
    (a worker builds one of these for every job it claims)."""

    __slots__ = ("_event", "_flag")

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        event = self._event
        if event is not None:
            event.set()

    def clear(self) -> None:
        self._flag = False
        event = self._event
        if event is not None:
            event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        with _EVENT_MADE:
            if self._event is None:
                self._event = threading.Event()
                if self._flag:  # set while the event was being made
                    self._event.set()
        return self._event.wait(timeout)


_EVENT_MADE = threading.Lock()


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
    priority: int = 0
    """0 runs first, 9 last."""
    timeout_seconds: float | None = None
    """Seconds this job's attempts may run (None: the handler's or the worker's default)."""
    cancel_requested_at: datetime | None = None
    releases: int = 0
    """Consecutive give-backs that did not count as attempts (outages, shutdowns)."""
    trace_context: dict[str, str] | None = None
    """The W3C trace context of the span that enqueued the job (OpenTelemetry)."""
    group_key: str | None = None
    """The job's concurrency group (a tenant, an account, a host), or None."""
    claims: int = 0
    """How many times the job was claimed, this claim included: the number its
    lease is held by (nothing lowers it, where a give-back or a retry lowers
    `attempts`)."""
    cancelled: StopSignal = dataclasses.field(default_factory=StopSignal, compare=False, repr=False)
    """Set when the attempt should stop: its timeout passed or somebody cancelled the job.
    A sync handler checks it (or calls `raise_if_cancelled`) between steps; an async
    handler is cancelled outright and sees `asyncio.CancelledError`."""

    def raise_if_cancelled(self) -> None:
        """Raise `rota.Cancelled` when this attempt should stop (see `cancelled`)."""
        if self.cancelled.is_set():
            raise Cancelled(f"job {self.id} was asked to stop")

    @property
    def effect_key(self) -> str:
        """A stable key to hand to external systems: the same on every attempt.

        The job's idempotency key when it has one, otherwise one derived from its id.
        """
        return self.idempotency_key or f"rota-job:{self.id}"

    def to_row(self) -> dict[str, Any]:
        """The job's columns as plain data (the stop signal is not a column)."""
        return {f.name: getattr(self, f.name) for f in _COLUMNS}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        values = {f.name: row[f.name] for f in _COLUMNS if f.name in row}
        values["status"] = Status.stored(values["status"])
        return cls(**values)


_COLUMNS = tuple(f for f in dataclasses.fields(Job) if f.name != "cancelled")


@dataclasses.dataclass(frozen=True, slots=True)
class NewJob:
    """A job to enqueue (see `rota.enqueue_many`)."""

    type: str
    payload: Any = None
    key: str | None = None
    run_at: datetime | None = None
    delay: float | None = None
    max_attempts: int | None = None
    priority: int | None = None
    """0 (runs first) to 9; None: the handler's default, else 0."""
    timeout: float | None = None
    """Seconds an attempt may run; None: the handler's or the worker's default."""
    group: str | None = None
    """The job's concurrency group (see `rota.set_limit`'s group_concurrency)."""
    unique_for: float | None = None
    """Seconds after the first job with `key` during which the key gives that
    job's id instead of making a new job; None: no window."""
    unique_active: bool = False
    """`key` is held only while its job is ready, running or waiting: once it has
    finished, the key makes a new job."""
