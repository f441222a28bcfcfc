"""Maintenance services inside the worker: the reaper and the scheduler.

A service has ``name``, ``interval_seconds`` and ``run_once(dsn)``; this module
runs each in a thin loop. Every worker runs them by default, and that is safe:
each service's statements use SKIP LOCKED and idempotency keys, so many
instances share the work instead of doubling it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    services: list[Service] = []
    if settings.run_reaper:
        services.append(Reaper(settings.reaper))
    if settings.run_scheduler:
        scheduler = _scheduler()
        if scheduler is not None:
            services.append(scheduler)
    return services


def _scheduler() -> Service | None:
    try:
        from rota.scheduler import Scheduler
    except ImportError:  # pragma: no cover - schedules not installed
        return None
    return Scheduler()


async def run_service(
    service: Service,
    dsn: str,
    io: Executor,
    stopping: asyncio.Event,
    wake: asyncio.Event | None = None,
) -> None:
    """Call `run_once` every interval until stopped; log results and failures."""
    loop = asyncio.get_running_loop()
    while not stopping.is_set():
        if wake is not None:
            wake.clear()
        try:
            result = await loop.run_in_executor(io, service.run_once, dsn)
            if _worth_logging(result):
                log.info("%s: %s", service.name, result)
        except Exception as exc:
            log.warning("%s failed: %s", service.name, exc)
        waiters = [asyncio.create_task(stopping.wait())]
        if wake is not None and getattr(service, "wakes_on_schedule_change", False):
            waiters.append(asyncio.create_task(wake.wait()))
        await asyncio.wait(
            waiters, timeout=service.interval_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        for w in waiters:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w


def _worth_logging(result: Any) -> bool:
    count = getattr(result, "count", None)
    return bool(count)
