"""One shape for the worker's background loops: start, stop, and a `run_once`.

Each loop does one job (renew leases, watch the event loop, probe the claims'
start, listen for wake-ups) in a thread of its own, on a connection of its
own (if it needs one): no handler, no stalled event loop and no slow
neighbour can hold it up. Its `run_once` does one round and returns; the
thread only calls it every `interval`, and after a failure waits the next step
of its `Backoff` (an outage: the connection is closed and opened again by the
next round; a refusal: logged as an error, tried again after the interval).
Tests call `run_once` directly: a loop is steppable without its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from rota import db
from rota.errors import DatabaseError, DatabaseUnavailable

log = logging.getLogger("rota.worker")

STOP_WAIT_SECONDS = 1.0
"""How long `stop` waits for a round in flight (the thread is a daemon: a stopping
worker must not outlast its grace for a round stuck on the network)."""


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


class Loop:
    """A background loop: `run_once` every `interval` seconds in a thread of its own."""

    name = "rota-loop"
    """The thread's name."""

    def __init__(
        self,
        interval: float,
        connect: Callable[[], db.Conn] | None = None,
        reconnect_max_seconds: float = 10.0,
    ) -> None:
        self.interval = interval
        self._connect = connect
        self.backoff = Backoff(most=reconnect_max_seconds)
        self.rounds = 0
        """Rounds that ended without an error."""
        self._conn: db.Conn | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        """One round of the loop's job (raises DatabaseUnavailable or DatabaseError)."""
        raise NotImplementedError

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a round still waiting for the database is not waited for
        long (its connection goes with the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_SECONDS)
            if self._thread.is_alive():
                return
        self.close()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        delay = self.interval
        while not self._stop.wait(delay):
            delay = self.step()

    def step(self) -> float:
        """One round, its failure handled: how long to wait before the next."""
        try:
            self.run_once()
        except DatabaseUnavailable as exc:
            self.close()
            wait = self.backoff.next()
            log.warning("%s: database unavailable (%s); next try in %.1fs", self.name, exc, wait)
            return wait
        except DatabaseError as exc:
            log.error("%s: refused (%s)", self.name, exc)
            return self.interval
        except Exception:  # a loop must outlive whatever one round meets
            self.close()
            wait = self.backoff.next()
            log.exception("%s: round failed; next try in %.1fs", self.name, wait)
            return wait
        self.rounds += 1
        self.backoff.reset()
        return self.interval

    # -- the loop's connection ----------------------------------------------------
    def connection(self) -> db.Conn:
        """The loop's own connection, opened when first needed (again after an outage)."""
        assert self._connect is not None, f"{self.name} has no connection"
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self.connected(self._conn)
        return self._conn

    def connected(self, conn: db.Conn) -> None:
        """Called once per new connection (a listener LISTENs here)."""

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
