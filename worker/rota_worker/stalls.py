"""The event loop's stall watch: a handler that blocks the loop is seen and counted.

The event loop marks each turn (`tick`, a task on the loop); a loop of its own
(`rota_worker.loops`, no connection) checks the mark: a loop that has not turned
for `loop_stall_seconds` is a stall, counted in ``rota_worker_loop_stalls_total``
and logged once per stall. Leases are renewed from another thread meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time

from rota.metrics import record_loop_stall
from rota_worker.loops import Loop

log = logging.getLogger("rota.worker")

TICK_SECONDS = 0.1
"""How often the event loop marks that it turns."""


class StallWatch(Loop):
    name = "rota-stall-watch"

    def __init__(self, stall_seconds: float) -> None:
        super().__init__(min(5 * TICK_SECONDS, stall_seconds))
        self.stall_seconds = stall_seconds
        self.last_tick = time.monotonic()
        """When the event loop last turned (set by `tick`)."""
        self.stalls = 0
        self._stalled = False

    def start(self) -> None:
        self.last_tick = time.monotonic()
        super().start()

    async def tick(self) -> None:
        """On the event loop: mark every turn, until cancelled."""
        while True:
            self.last_tick = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)

    def run_once(self) -> None:
        self.watch()

    def watch(self, now: float | None = None) -> bool:
        """Count and log a stall of the event loop (once per stall); True while stalled."""
        now = time.monotonic() if now is None else now
        blocked = now - self.last_tick
        if blocked < self.stall_seconds:
            self._stalled = False
            return False
        if not self._stalled:
            self._stalled = True
            self.stalls += 1
            record_loop_stall()
            log.warning(
                "the event loop has not turned for %.1fs: a handler blocks it (time.sleep or"
                " blocking I/O in an async def?); heartbeats go on from their own thread",
                blocked,
            )
        return True
