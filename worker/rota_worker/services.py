"""Maintenance services inside the worker: the reaper and the scheduler.

A service has ``name``, ``interval_seconds`` and ``run_once(dsn)``; this module
runs each in a thin loop. The scheduler brings a loop of its own (it sleeps
until the next due slot and listens for schedule changes) and runs in a thread.
Every worker runs them by default, and that is safe: each service's statements
use SKIP LOCKED and idempotency keys, so many instances share the work instead
of doubling it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Executor
from typing import Any, Protocol

from rota.reaper import Reaper
from rota_worker.settings import WorkerSettings

log = logging.getLogger("rota.worker")


class Service(Protocol):
    name: str
    interval_seconds: float

    def run_once(self, conn_or_dsn: Any, now: Any = None) -> Any: ...


def default_services(settings: WorkerSettings) -> list[Service]:
    return [Reaper(settings.reaper)] if settings.run_reaper else []


def start_scheduler(dsn: str, stop: threading.Event) -> threading.Thread:
    """The scheduler's own loop, in a daemon thread, until `stop` is set."""
    from rota.scheduler import Scheduler

    thread = threading.Thread(
        target=Scheduler().run, args=(dsn, stop), name="rota-scheduler", daemon=True
    )
    thread.start()
    return thread


async def run_service(service: Service, dsn: str, io: Executor, stopping: asyncio.Event) -> None:
    """Call `run_once` every interval until stopped; log results and failures."""
    loop = asyncio.get_running_loop()
    while not stopping.is_set():
        try:
            result = await loop.run_in_executor(io, service.run_once, dsn)
            if _worth_logging(result):
                log.info("%s: %s", service.name, result)
        except Exception as exc:
            log.warning("%s failed: %s", service.name, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=service.interval_seconds)


def _worth_logging(result: Any) -> bool:
    count = getattr(result, "count", None)
    return bool(count)
