"""One database connection for one loop of the worker, reopened after an outage;
and the waits the loops share.

Each loop (claim, flush, heartbeat, listen) owns a `Link`, and uses it for one
call at a time, so a connection is never shared between threads. A call that
fails because the database went away closes the connection; the next call opens
a new one. Blocking psycopg calls run on a small thread pool of their own, away
from the threads that run sync handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rota import db
from rota.errors import DatabaseUnavailable
from rota.settings import ConnectionSettings

log = logging.getLogger("rota.worker")

T = TypeVar("T")


class Deadlines:
    """The timeouts of every worker connection: how each is opened (connect timeout,
    keepalives, TCP_USER_TIMEOUT, statement timeout, see `ConnectionSettings`), and
    the answer deadline of each call, kept by one watchdog thread: a call that has
    had no answer for `answer_seconds` has its socket shut down, so the call fails
    as an outage (the connection is then reopened) instead of waiting for ever on a
    connection the network silently stopped carrying."""

    def __init__(self, settings: ConnectionSettings | None = None) -> None:
        self.settings = settings or ConnectionSettings()
        self.answer_seconds = self.settings.answer_timeout_seconds
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[db.Conn, float]] = {}
        self._watchdog: threading.Thread | None = None
        self.severed = 0
        """Connections shut down for want of an answer (for tests and logs)."""

    def connect(self, dsn: str, name: str, *, lock_timeout: bool = False) -> db.Conn:
        options = self.settings.libpq(dsn, lock_timeout=lock_timeout)
        return db.connect(dsn, application_name=f"rota-worker-{name}", **options)

    @contextlib.contextmanager
    def watch(self, conn: db.Conn, extra_seconds: float = 0.0) -> Iterator[None]:
        """Within the block, `conn` must answer within the deadline (plus `extra_seconds`)."""
        token = id(conn)
        with self._lock:
            self._calls[token] = (conn, time.monotonic() + self.answer_seconds + extra_seconds)
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name="rota-deadlines", daemon=True
                )
                self._watchdog.start()
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(token, None)

    def _watch(self) -> None:
        tick = min(0.25, self.answer_seconds / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self._lock:
                late = [(t, c) for t, (c, due) in self._calls.items() if now >= due]
                for token, _ in late:
                    del self._calls[token]
            for _, conn in late:
                self.severed += 1
                log.warning(
                    "no answer on a worker connection for %.0fs; taking it for dead",
                    self.answer_seconds,
                )
                sever(conn)


def sever(conn: db.Conn) -> None:
    """Shut the connection's socket down under whoever waits on it: their wait ends
    with an error (an outage), and the next call opens a new connection."""
    with contextlib.suppress(Exception):
        dup = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


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
        return self._deadlines.connect(self.dsn, self.name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(connection, *args)`` on the I/O pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, functools.partial(self._call, fn, args))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class Backoff:
    """Growing waits between reconnection attempts, reset by a success."""

    def __init__(self, first: float = 0.1, most: float = 10.0) -> None:
        self.first = first
        self.most = most
        self.current = first

    def next(self) -> float:
        delay, self.current = self.current, min(self.current * 2, self.most)
        return delay

    def reset(self) -> None:
        self.current = self.first


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
