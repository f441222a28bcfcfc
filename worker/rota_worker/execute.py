"""Run one attempt of a job and turn what happened into its outcome.

Pure decision code around the call: success is done; `Retry` and ordinary
exceptions are retries (dead at max_attempts, decided by the database);
`Permanent` and unknown types are failed; infrastructure errors (the database
went away under the handler) give the job back without counting the attempt,
waiting longer each time, until `MAX_RELEASES` in a row count as an attempt.

An attempt can be stopped from outside (`Execution.stop`): at its timeout, on a
cancel request, when its lease was lost, or at shutdown. An async handler is
cancelled and sees `asyncio.CancelledError`; a sync handler sees `job.cancelled`
set and is no longer waited for: its outcome is decided at once and its slot
freed, whether or not its thread or child process has returned yet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rota import db, limits, tracing
from rota.claim import Attempt
from rota.errors import Cancelled, Permanent, Retry, Suspended
from rota.handlers import Context, Handler, acall
from rota.jobs import Job, Outcome
from rota.retry import backoff_seconds, describe_error
from rota.settings import BackoffSettings
from rota_worker import attempts
from rota_worker.attempts import State

log = logging.getLogger("rota.worker")

OUTAGE_RETRY_SECONDS = 2.0
"""A job given back because the database failed under it waits this long, doubled
for every consecutive give-back."""

OUTAGE_RETRY_MAX_SECONDS = 300.0
"""The longest wait of a job given back for an outage."""

MAX_RELEASES = 10
"""Consecutive outage give-backs a job gets before the next counts as an attempt."""

SyncRunner = Callable[[Handler, Job, Context, Callable[[], None]], Awaitable[Any]]
"""How a sync handler is run: in a thread, or in a child process. It calls the
last argument when the handler really starts (its time limit runs from then),
and returns what the handler returned."""


class Decided(Exception):
    """The handler ran elsewhere (a child process), which decided the outcome."""

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(attempt.outcome)
        self.attempt = attempt


class Stop(enum.StrEnum):
    """Why an attempt was stopped before its handler returned."""

    TIMEOUT = "timeout"
    CANCEL = "cancel"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


@dataclasses.dataclass(eq=False)
class Execution:
    """This worker's record of one attempt: the job, where it is in its life
    (`rota_worker.attempts`), its task, and why it was stopped (if it was).

    Compared by identity: a job given back and claimed again in one statement has
    the same (job id, attempt) as before, and is a new record."""

    job: Job
    timeout_seconds: float | None = None
    state: State = State.WAITING
    stopped: Stop | None = None
    task: asyncio.Task[None] | None = None
    """None until the attempt starts (a job claimed ahead waits for a slot)."""
    held_at: float = dataclasses.field(default_factory=time.monotonic)
    """When this worker took the job (monotonic clock)."""
    _timer: asyncio.TimerHandle | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.job.id, self.job.attempts)

    def move(self, to: State) -> bool:
        """Move this attempt on in its life (see `rota_worker.attempts.move`)."""
        if to in attempts.MOVES[self.state]:  # the legal move, in this one call
            self.state = to
            return True
        return attempts.move(self, to)

    def start_clock(self) -> None:
        """The handler starts now: from here its time limit runs (if it has one)."""
        if self.timeout_seconds is not None and self.task is not None and not self.task.done():
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.timeout_seconds, self.stop, Stop.TIMEOUT)

    def stop_clock(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stop(self, why: Stop) -> None:
        """Stop the attempt (the first reason wins); safe to call more than once.

        One that has not started yet never will: the reason decides its outcome."""
        if self.stopped is not None or (self.task is not None and self.task.done()):
            return
        self.stopped = why
        self.job.cancelled.set()
        if self.task is not None:
            self.task.cancel()


def timeout_of(job: Job, handler: Handler | None, default: float | None) -> float | None:
    """The job's own timeout, else its handler's, else the worker's default."""
    if job.timeout_seconds is not None:
        return job.timeout_seconds
    if handler is not None and handler.timeout is not None:
        return handler.timeout
    return default


async def run_attempt(
    execution: Execution,
    handler: Handler | None,
    context: Context,
    run_sync: SyncRunner,
    backoff: BackoffSettings,
) -> Attempt:
    """Run the handler; return what to write, whether it returned, raised or was stopped.

    With OpenTelemetry installed, the attempt runs in a consumer span (see rota.tracing)."""
    job = execution.job
    outcome: Attempt | None = None
    with tracing.consumer(job) as span:
        started = time.perf_counter()
        try:
            if handler is None:
                raise Permanent(f"no handler registered for job type {job.type!r}")
            if handler.is_async:
                execution.start_clock()
                value = await acall(handler, job, context)
            else:
                value = await run_sync(handler, job, context, execution.start_clock)
            result = None if value is None else limits.encode_result(value)
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if execution.stopped is None:
                if current is not None and current.cancelling():
                    raise  # not ours: the loop itself is going away
                # Nobody stopped the attempt: the handler raised it itself.
                outcome = raised_cancel(job, exc, backoff)
            else:
                if current is not None and current.cancelling():
                    current.uncancel()
                outcome = stopped_outcome(execution, backoff)
        except Cancelled:
            outcome = stopped_outcome(execution, backoff)
        except Decided as decided:
            outcome = decided.attempt
        except BaseException as exc:
            outcome = outcome_of_error(job, exc, backoff)
        finally:
            execution.stop_clock()
        duration = time.perf_counter() - started
        if outcome is None:  # the common case, built once with its type and duration
            attempt = Attempt(
                job.id, job.attempts, Outcome.DONE, 0.0, None, job.type, duration, execution, result
            )
        else:
            attempt = dataclasses.replace(
                outcome, type=job.type, duration_seconds=duration, owner=execution
            )
        if span is not None:
            tracing.ended(span, attempt.outcome, attempt.error)
    return attempt


def raised_cancel(job: Job, exc: BaseException, backoff: BackoffSettings) -> Attempt:
    """A handler raised `asyncio.CancelledError` although nobody stopped it: an
    ordinary failure (a retry, counted), with a last_error that says so."""
    frames = describe_error(exc).partition("\n")[2]
    error = "CancelledError: the handler raised it itself (nothing asked it to stop)"
    return Attempt(
        job.id,
        job.attempts,
        Outcome.RETRY,
        backoff_seconds(job.attempts, backoff),
        f"{error}\n{frames}" if frames else error,
    )


def stopped_outcome(execution: Execution, backoff: BackoffSettings) -> Attempt:
    """The outcome of an attempt stopped from outside (or that raised `Cancelled`)."""
    job = execution.job
    why = execution.stopped
    if why is Stop.CANCEL:
        return Attempt(job.id, job.attempts, Outcome.CANCELLED, error="Cancelled: by request")
    if why is Stop.LEASE_LOST:
        return Attempt(job.id, job.attempts, Outcome.LEASE_LOST)
    if why is Stop.SHUTDOWN:
        return Attempt(job.id, job.attempts, Outcome.RELEASED, error="Released: worker shut down")
    if why is Stop.TIMEOUT:
        limit = execution.timeout_seconds
        error = f"Timeout: the attempt ran longer than its {limit or 0:g}s limit"
    else:  # the handler raised Cancelled on its own
        error = f"Cancelled: job {job.id} stopped itself"
    return Attempt(
        job.id, job.attempts, Outcome.RETRY, backoff_seconds(job.attempts, backoff), error
    )


def outcome_of_error(job: Job, exc: BaseException, backoff: BackoffSettings) -> Attempt:
    """What a handler's exception means for its job."""
    if isinstance(exc, Suspended):  # the run wrote the job waiting: nothing to write
        return Attempt(job.id, job.attempts, Outcome.WAITING)
    if isinstance(exc, Permanent):
        return Attempt(job.id, job.attempts, Outcome.FAILED, error=describe_error(exc))
    if db.is_unavailable(exc) and job.releases < MAX_RELEASES:
        delay = min(OUTAGE_RETRY_SECONDS * 2**job.releases, OUTAGE_RETRY_MAX_SECONDS)
        log.warning(
            "job %s: database unavailable under the handler; given back for %.0fs", job.id, delay
        )
        return Attempt(job.id, job.attempts, Outcome.RELEASED, delay, describe_error(exc))
    if isinstance(exc, Retry) and exc.delay is not None:
        delay = exc.delay
    else:
        delay = backoff_seconds(job.attempts, backoff)
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        # A handler must not stop the worker; treat it as an ordinary failure.
        log.error("job %s: handler raised %s", job.id, type(exc).__name__)
    return Attempt(job.id, job.attempts, Outcome.RETRY, delay, error=describe_error(exc))
