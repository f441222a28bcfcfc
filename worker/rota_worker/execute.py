"""Run one handler and turn what happened into an outcome for the queue.

Pure decision code around the call: success is done; `Retry` and ordinary
exceptions are retries (dead at max_attempts, decided by the database);
`Permanent` and unknown types are failed; infrastructure errors (the database
went away under the handler) give the job back without counting the attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from concurrent.futures import Executor

from rota import db
from rota.claim import Finish
from rota.errors import Permanent, Retry
from rota.handlers import Context, Handler
from rota.jobs import Job
from rota.retry import backoff_seconds, describe_error
from rota.settings import BackoffSettings

log = logging.getLogger("rota.worker")

OUTAGE_RETRY_SECONDS = 2.0
"""A job given back because the database failed under it waits this long."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ran:
    finish: Finish
    duration_seconds: float


async def run_handler(
    job: Job,
    handler: Handler | None,
    context: Context,
    threads: Executor,
    backoff: BackoffSettings,
) -> Ran:
    started = time.perf_counter()
    try:
        if handler is None:
            raise Permanent(f"no handler registered for job type {job.type!r}")
        args = (job, context) if handler.wants_context else (job,)
        if handler.is_async:
            await handler.func(*args)
        else:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(threads, functools.partial(handler.func, *args))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        finish = outcome_of_error(job, exc, backoff)
    else:
        finish = Finish(job.id, job.attempts, "done")
    return Ran(finish, time.perf_counter() - started)


def outcome_of_error(job: Job, exc: BaseException, backoff: BackoffSettings) -> Finish:
    """What a handler's exception means for its job."""
    if isinstance(exc, Permanent):
        return Finish(job.id, job.attempts, "failed", error=describe_error(exc))
    if db.is_unavailable(exc):
        log.warning("job %s: database unavailable under the handler; given back", job.id)
        return Finish(
            job.id, job.attempts, "release", OUTAGE_RETRY_SECONDS, error=describe_error(exc)
        )
    if isinstance(exc, Retry) and exc.delay is not None:
        delay = exc.delay
    else:
        delay = backoff_seconds(job.attempts, backoff)
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        # A handler must not stop the worker; treat it as an ordinary failure.
        log.error("job %s: handler raised %s", job.id, type(exc).__name__)
    return Finish(job.id, job.attempts, "retry", delay, error=describe_error(exc))
