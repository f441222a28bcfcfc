"""One shape for every background loop: start, stop, and a `run_once`.

Each loop does one job (reap expired leases, schedule cron slots, renew a
worker's leases, refresh its registry row, listen for wake-ups...) in a thread
of its own, on a connection of its own (if it needs one): no handler, no
stalled event loop and no slow neighbour can hold it up. Its `run_once` does
one round and returns; the thread calls it again after `next_wait` (the
`interval` unless the loop knows better), and after a failure waits the next
step of its `Backoff` (an outage: the connection is closed and opened again by
the next round; a refusal: logged as an error, tried again after the
interval; a connection option libpq refuses, which no wait mends: the loop
ends, `run` raising `ConnectionOptionRefused`, a thread logging it). `wait`
may end early (a loop listening on its connection ends it on a NOTIFY). Tests
call `run_once` or `step` directly: a loop is steppable without its thread.
`run` turns the loop in the calling thread (`rota reaper` does), `start` in a
daemon thread of its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from rota import db
from rota.errors import ConnectionOptionRefused, DatabaseError, DatabaseUnavailable, one_line

STOP_WAIT_SECONDS = 1.0
"""How long `stop` waits for a round in flight (the thread is a daemon: a stopping
process must not outlast its grace for a round stuck on the network)."""


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


class Loop:
    """A background loop: `run_once`, then wait `next_wait` seconds, until stopped."""

    name = "rota-loop"
    """The thread's name, and the loop's name in its log lines."""
    log = logging.getLogger("rota.loops")
    run_at_start = False
    """Run the first round at once (True), or after the first `interval`."""

    def __init__(
        self,
        interval: float,
        connect: Callable[[], db.Conn] | None = None,
        reconnect_max_seconds: float = 10.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.interval = interval
        self._connect = connect
        self.backoff = Backoff(most=reconnect_max_seconds)
        self.rounds = 0
        """Rounds that ended without an error."""
        self._conn: db.Conn | None = None
        self._own_stop = stop is None
        self._stop = stop if stop is not None else threading.Event()
        """Set by `stop` (or by whoever shares it: one event can stop many loops)."""
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        """One round of the loop's job (raises DatabaseUnavailable or DatabaseError)."""
        raise NotImplementedError

    def next_wait(self) -> float:
        """Seconds to wait after a round that ended without an error."""
        return self.interval

    def wait(self, seconds: float) -> bool:
        """Wait `seconds`, or until stopped (True: stopped)."""
        return self._stop.wait(seconds)

    def failed(self, exc: BaseException) -> None:
        """A round failed (called by `step` before it waits; a service loop
        remembers it)."""

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        """`run` in a daemon thread of its own."""
        if self._own_stop:
            self._stop.clear()
        self._thread = threading.Thread(target=self._run_in_thread, name=self.name, daemon=True)
        self._thread.start()

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except ConnectionOptionRefused as exc:
            # Nobody to raise it to: the process checks its options at start.
            self.log.error("%s: ended: %s", self.name, one_line(exc))

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

    def run(self) -> None:
        """Turn the loop in the calling thread until stopped; the connection is
        closed at the end."""
        delay = 0.0 if self.run_at_start else self.interval
        try:
            while not self._stop.is_set() and not (delay > 0 and self.wait(delay)):
                delay = self.step()
        finally:
            self.close()

    def step(self) -> float:
        """One round, its failure handled: how long to wait before the next."""
        try:
            self.run_once()
            wait = self.next_wait()
        except Exception as exc:
            self.failed(exc)
            return self._after_failure(exc)
        self.rounds += 1
        self.backoff.reset()
        return wait

    def _after_failure(self, exc: Exception) -> float:
        """Handle a round's failure by its kind: how long to wait before the next."""
        if isinstance(exc, ConnectionOptionRefused):
            self.close()
            raise exc  # bad input, which no wait mends: the loop's owner says why
        if isinstance(exc, DatabaseUnavailable):
            self.close()
            wait = self.backoff.next()
            self.log.warning(
                "%s: database unavailable (%s); next try in %.1fs", self.name, one_line(exc), wait
            )
            return wait
        if isinstance(exc, DatabaseError):
            self.log.error("%s: refused (%s)", self.name, one_line(exc))
            return self.interval
        # A loop must outlive whatever one round meets.
        self.close()
        wait = self.backoff.next()
        self.log.error("%s: round failed; next try in %.1fs", self.name, wait, exc_info=exc)
        return wait

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
