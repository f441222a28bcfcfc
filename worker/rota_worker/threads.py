"""Sync handlers in threads (the default isolation): cheap, but not killable.

A thread cannot be stopped from outside. When an attempt is stopped (timeout,
cancel request, lost lease) the worker stops waiting for it at once and frees
its slot; the handler sees ``job.cancelled`` set and should return. A thread
that does not is *abandoned*: it runs on, counted, until it returns. Once the
abandoned threads reach the worker's concurrency, /healthz fails so that
Kubernetes restarts the pod (the only way to reclaim them).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rota import handlers
from rota.handlers import Context, Handler
from rota.jobs import Job


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
        """Threads still running handlers the worker stopped waiting for."""
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
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.done():
                self._abandon(future)
            raise

    def _abandon(self, future: Future[object]) -> None:
        with self._lock:
            self._abandoned += 1
        future.add_done_callback(self._returned)

    def _returned(self, _: Future[object]) -> None:
        with self._lock:
            self._abandoned -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
