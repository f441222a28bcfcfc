"""One database connection for one loop of the worker, reopened after an outage;
and the waits the loops share.

Each loop (claim, flush, heartbeat, listen) owns a `Link`, and uses it for one
call at a time, so a connection is never shared between threads. A call that
fails because the database went away closes the connection; the next call opens
a new one. Each call has the answer deadline of `rota.deadlines.Deadlines`.
Blocking psycopg calls run on a small thread pool of their own, away from the
threads that run sync handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rota import db
from rota.deadlines import Deadlines
from rota.errors import DatabaseUnavailable
from rota_worker.loops import Backoff

__all__ = ["Backoff", "Link", "first"]

T = TypeVar("T")


class Link:
    def __init__(
        self,
        dsn: str,
        name: str,
        io: ThreadPoolExecutor,
        deadlines: Deadlines | None = None,
        extra_seconds: float = 0.0,
    ) -> None:
        self.dsn = dsn
        self.name = name
        self._io = io
        self._deadlines = deadlines
        self._extra = extra_seconds
        """Added to the answer deadline of this link's calls (a claim that first
        waits for a NOTIFY gets the poll interval)."""
        self._conn: db.Conn | None = None

    def _call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        try:
            if self._deadlines is None:
                return fn(self._conn, *args)
            with self._deadlines.watch(self._conn, self._extra):
                return fn(self._conn, *args)
        except DatabaseUnavailable:
            self.close()
            raise

    def _connect(self) -> db.Conn:
        if self._deadlines is None:
            return db.connect(self.dsn, application_name=f"rota-worker-{self.name}")
        return self._deadlines.connect(self.dsn, f"rota-worker-{self.name}")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(connection, *args)`` on the I/O pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, functools.partial(self._call, fn, args))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


async def first(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Wait until any of `events` is set, or `timeout` passes."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waiters, return_exceptions=True)
