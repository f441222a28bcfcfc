"""Run one attempt of a job and turn what happened into its outcome.

Pure decision code around the call: success is done; `Retry` and ordinary
exceptions are retries (dead at max_attempts, decided by the database);
`Permanent` and unknown types are failed; infrastructure errors (the database
went away under the handler) give the job back without counting the attempt,
waiting longer each time, until `MAX_RELEASES` in a row count as an attempt.

An attempt can be stopped from outside (a stop event of `rota_worker.attempts`):
at its timeout, on a cancel request, when its lease was lost, or at shutdown.
An async handler is cancelled and sees `asyncio.CancelledError`; a sync handler
sees `job.cancelled` set. The attempt ends when its handler really has: a
thread that ignores the stop keeps its slot (and is reported) until it returns,
a child process is killed first (see `rota_worker.threads`, `.processes`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rota import db, limits, tracing
from rota.attempt import Attempt
from rota.decoding import Unreadable
from rota.errors import Cancelled, CancelRequested, Permanent, Retry, Suspended
from rota.handlers import Context, Handler, acall
from rota.jobs import Job, Outcome
from rota.retry import MAX_RELEASES, backoff_seconds, describe_error
from rota.settings import BackoffSettings
from rota_worker.attempts import Event, Execution

log = logging.getLogger("rota.worker")

OUTAGE_RETRY_SECONDS = 2.0
"""A job given back because the database failed under it waits this long, doubled
for every consecutive give-back."""

OUTAGE_RETRY_MAX_SECONDS = 300.0
"""The longest wait of a job given back for an outage."""


SyncRunner = Callable[[Handler, Job, Context, Callable[[], None]], Awaitable[Any]]
"""How a sync handler is run: in a thread, or in a child process. It calls the
last argument when the handler really starts (its time limit runs from then),
and returns what the handler returned."""


class Decided(Exception):
    """The handler ran elsewhere (a child process), which decided the outcome."""

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(attempt.outcome)
        self.attempt = attempt


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
                if execution.stopped is not None:
                    # It caught its stop and returned: the stop decides, as it
                    # does for a sync handler that returns after its stop.
                    raise asyncio.CancelledError
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
        except Cancelled as exc:
            outcome = stopped_outcome(execution, backoff, exc)
        except Decided as decided:
            outcome = decided.attempt
        except BaseException as exc:
            outcome = outcome_of_error(job, exc, backoff)
        finally:
            execution.stop_clock()
        duration = time.perf_counter() - started
        if outcome is None:  # the common case, built once with its type and duration
            attempt = Attempt(
                job.id, job.attempts, Outcome.DONE, 0.0, None, job.type, duration, result,
                job.claims,
            )  # fmt: skip
        else:
            attempt = dataclasses.replace(outcome, type=job.type, duration_seconds=duration)
        if span is not None:
            tracing.ended(span, attempt.outcome, attempt.error)
    return attempt


def raised_cancel(job: Job, exc: BaseException, backoff: BackoffSettings) -> Attempt:
    """A handler raised `asyncio.CancelledError` although nobody stopped it: an
    ordinary failure (a retry, counted), with a last_error that says so."""
    frames = describe_error(exc).partition("\n")[2]
    error = "CancelledError: the handler raised it itself (nothing asked it to stop)"
    return Attempt.of(
        job,
        Outcome.RETRY,
        backoff_seconds(job.attempts, backoff),
        f"{error}\n{frames}" if frames else error,
    )


def stopped_outcome(
    execution: Execution, backoff: BackoffSettings, raised: Cancelled | None = None
) -> Attempt:
    """The outcome of an attempt stopped from outside (or that raised `Cancelled`)."""
    job = execution.job
    why = execution.stopped
    if why is None and isinstance(raised, CancelRequested):
        why = Event.CANCEL  # its run found the request before the worker heard of it
    if why is Event.CANCEL:
        return cancelled_by_request(job)
    if why is Event.LEASE_LOST:
        return Attempt.of(job, Outcome.LEASE_LOST)
    if why is Event.SHUTDOWN:
        return Attempt.of(job, Outcome.RELEASED, error="Released: worker shut down")
    if why is Event.NO_SLOT:
        return Attempt.of(job, Outcome.RELEASED)
    if why is Event.UNREADABLE:
        error = job.payload.error if isinstance(job.payload, Unreadable) else "unreadable row"
        return Attempt.of(job, Outcome.DEAD, error=error)
    if why is Event.TIMEOUT:
        limit = execution.timeout_seconds
        error = f"Timeout: the attempt ran longer than its {limit or 0:g}s limit"
    else:  # the handler raised Cancelled on its own
        error = f"Cancelled: job {job.id} stopped itself"
    return Attempt.of(job, Outcome.RETRY, backoff_seconds(job.attempts, backoff), error)


def cancelled_by_request(job: Job) -> Attempt:
    """The outcome of an attempt that ended because somebody cancelled its job."""
    return Attempt.of(job, Outcome.CANCELLED, error="Cancelled: by request")


def outcome_of_error(job: Job, exc: BaseException, backoff: BackoffSettings) -> Attempt:
    """What a handler's exception means for its job."""
    if isinstance(exc, Suspended):  # the run wrote the job waiting: nothing to write
        return Attempt.of(job, Outcome.WAITING)
    if isinstance(exc, CancelRequested):  # in a child process (see `stopped_outcome`)
        return cancelled_by_request(job)
    if isinstance(exc, Permanent):
        return Attempt.of(job, Outcome.FAILED, error=describe_error(exc))
    if db.is_unavailable(exc) and job.releases < MAX_RELEASES:
        delay = min(OUTAGE_RETRY_SECONDS * 2**job.releases, OUTAGE_RETRY_MAX_SECONDS)
        log.warning(
            "job %s: database unavailable under the handler; given back for %.0fs", job.id, delay
        )
        return Attempt.of(job, Outcome.RELEASED, delay, describe_error(exc))
    if isinstance(exc, Retry) and exc.delay is not None:
        delay = exc.delay
    else:
        delay = backoff_seconds(job.attempts, backoff)
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        # A handler must not stop the worker; treat it as an ordinary failure.
        log.error("job %s: handler raised %s", job.id, type(exc).__name__)
    return Attempt.of(job, Outcome.RETRY, delay, error=describe_error(exc))
