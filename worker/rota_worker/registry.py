"""This worker's row in rota.worker: registered at start, refreshed, taken out at stop.

Refreshed every `registry_refresh_seconds` on a connection of its own, off the
lease-critical path (leases are renewed by `rota_worker.leases`); the refresh
also writes the queue's minute samples. A failure is logged and never fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rota import workers
from rota.errors import RotaError
from rota_worker.link import Link

log = logging.getLogger("rota.worker")


class Registry:
    def __init__(self, info: workers.WorkerInfo, link: Link, interval: float) -> None:
        self.info = info
        self.link = link
        self.interval = interval
        self.registered = False

    async def register(self) -> None:
        await self.run_once(workers.register)
        self.registered = True

    async def deregister(self) -> None:
        if self.registered:
            await self.run_once(workers.deregister)

    async def run(self) -> None:
        """Refresh the row every `interval`, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.run_once(workers.refresh)

    async def run_once(self, call: Callable[..., object] = workers.refresh) -> None:
        ttl = max(workers.DEFAULT_TTL_SECONDS, 3 * self.interval)
        try:
            await self.link.run(call, self.info, ttl)
        except RotaError as exc:
            log.warning("worker %s: cannot update rota.worker (%s)", self.info.id, exc)
