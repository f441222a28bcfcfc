"""The worker's side of the one loop shape (`rota.loops`): its loops (lease
renewal, stall watch, floor probe, listener, registry refresh) are
`rota.loops.Loop`s logging as the worker; and `Wakeup`, the event loop's
one-waiter signal.
"""

from __future__ import annotations

import asyncio
import logging

from rota import loops
from rota.loops import STOP_WAIT_SECONDS, Backoff

__all__ = ["STOP_WAIT_SECONDS", "Backoff", "Loop", "Wakeup"]

log = logging.getLogger("rota.worker")


class Wakeup:
    """One waiter on the event loop, woken by `set` (or its timeout): one future, so
    the waiter resumes on the loop's next turn, ahead of tasks started meanwhile."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        if self._future is None or self._future.done():
            self._future = loop.create_future()
        future = self._future
        timer = loop.call_later(timeout, self.set) if timeout is not None else None
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()


class Loop(loops.Loop):
    """A background loop of the worker (`rota.loops.Loop`, logging as the worker)."""

    log = log
