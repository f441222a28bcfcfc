"""Sync handlers in threads (the default isolation): cheap, but not killable.

A thread cannot be stopped from outside. When an attempt is stopped (timeout,
cancel request, lost lease) the handler sees ``job.cancelled`` set and should
return. A thread that has not returned `HEED_SECONDS` after its stop *overruns*
it: it is logged and counted, and its attempt keeps its slot (and its lease,
renewed) until the thread really returns, so that a concurrency limit still
counts it and no second handler starts beside it. Once the overrunning threads
reach the worker's concurrency, /healthz fails so that Kubernetes restarts the
pod (the only way to reclaim them). A second cancel (the event loop going away
at exit) is not waited out.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rota import handlers
from rota.handlers import Context, Handler
from rota.jobs import Job

log = logging.getLogger("rota.worker")

HEED_SECONDS = 1.0
"""How long a stopped handler's thread may take to return before it counts as
running on past its stop: one that heeds `job.cancelled` returns within moments."""


class ThreadRunner:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        # Room for every slot and as many abandoned threads: past that the worker
        # reports itself unhealthy and is restarted anyway.
        self._pool = ThreadPoolExecutor(2 * concurrency, thread_name_prefix="rota-job")
        self._lock = threading.Lock()
        self._abandoned = 0

    @property
    def abandoned(self) -> int:
        """Threads still running handlers whose attempt was stopped (overrunning)."""
        with self._lock:
            return self._abandoned

    @property
    def healthy(self) -> bool:
        return self.abandoned < self.concurrency

    async def __call__(
        self, handler: Handler, job: Job, context: Context, started: Callable[[], None]
    ) -> Any:
        started()
        # In a copy of this task's context, as asyncio.to_thread does: the handler's
        # own spans (OpenTelemetry) are children of its attempt's.
        call = functools.partial(handlers.call, handler, job, context)
        future = self._pool.submit(contextvars.copy_context().run, call)
        waited = asyncio.wrap_future(future)
        # Once the attempt is stopped nobody awaits the thread's answer (the stop
        # decides the outcome): read it when it comes, so that what the handler
        # raised is never reported as an exception left unread.
        waited.add_done_callback(_read)
        try:
            return await asyncio.shield(waited)
        except asyncio.CancelledError:
            if not future.done():
                await self._overrun(future, waited, job)
            raise

    async def _overrun(self, future: Future[object], waited: asyncio.Future[Any], job: Job) -> None:
        """The attempt was stopped and its thread has not returned: wait for it, and
        count it once it has had `HEED_SECONDS` to return."""
        if (await asyncio.wait([waited], timeout=HEED_SECONDS))[0]:
            return
        self._abandon(future)
        log.warning(
            "job %s attempt %s: the handler's thread runs on past its stop; its slot stays"
            " taken until it returns",
            job.id,
            job.attempts,
        )
        # Only a second cancel (the loop going away) ends the wait early.
        await asyncio.wait([waited])

    def _abandon(self, future: Future[object]) -> None:
        with self._lock:
            self._abandoned += 1
        future.add_done_callback(self._returned)

    def _returned(self, _: Future[object]) -> None:
        with self._lock:
            self._abandoned -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _read(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()
