"""Heartbeats that nothing in a handler can stop, and the event loop's stall watch.

Leases are renewed from a thread of their own, on a connection of its own, not
from the event loop the async handlers share: an async handler that blocks the
loop (``time.sleep`` in an ``async def``) cannot cost its neighbours their
leases. The heartbeat statement runs under a lock timeout and every call under
an answer deadline (see `rota.deadlines.Deadlines`), so a row lock or a
half-open socket cannot hang it either.

What the heartbeat learns (leases lost, cancels requested) is handed to the
event loop, which stops those attempts (`LeaseKeeper.apply`). The same thread
watches the loop: a loop that has not turned for `loop_stall_seconds` is a
stall, counted in ``rota_worker_loop_stalls_total`` and logged once per stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from rota import claim as claims
from rota import db
from rota.deadlines import Deadlines
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.metrics import record_loop_stall
from rota_worker.leases import Key, LeaseKeeper

log = logging.getLogger("rota.worker")

STOP_WAIT_SECONDS = 1.0
"""How long a stopping worker waits for a heartbeat in flight."""

LOOP_TICK_SECONDS = 0.1
"""How often the event loop marks that it turns (for the stall watch)."""


class Heartbeat:
    def __init__(
        self,
        dsn: str,
        keeper: LeaseKeeper,
        deadlines: Deadlines,
        loop_stall_seconds: float,
        floor: claims.Floor | None = None,
        wake_claims: Callable[[], None] = lambda: None,
    ) -> None:
        self.dsn = dsn
        self.floor = floor
        """The claims' start, probed every `Floor.PROBE_SECONDS` (see rota.claim.Floor)."""
        self.wake_claims = wake_claims
        """Wakes an idle claim when the probe found jobs behind the start (thread-safe)."""
        self.probes = 0
        """Probes of the floor answered."""
        self.keeper = keeper
        self.deadlines = deadlines
        self.loop_stall_seconds = loop_stall_seconds
        self.interval = keeper.lease_seconds / 3
        self.last_ok = time.monotonic()
        """When a heartbeat last renewed every lease it was asked to (or had none to)."""
        self.loop_tick = time.monotonic()
        """When the event loop last turned (set by `tick_loop`)."""
        self.stalls = 0
        self._stalled = False
        self._stop = threading.Event()
        self._conn: db.Conn | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the thread (on the event loop, which then turns: the time spent
        waiting for the database before is neither a stall nor a missed heartbeat)."""
        self._loop = loop
        self.last_ok = self.loop_tick = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rota-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating. A beat still waiting for the database is not waited for long:
        the thread is a daemon, and a stopping worker must not outlast its grace."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_SECONDS)
            if self._thread.is_alive():
                return  # its connection goes with the process
        self._close()

    async def tick_loop(self) -> None:
        """On the event loop: mark every turn, until cancelled."""
        while True:
            self.loop_tick = time.monotonic()
            await asyncio.sleep(LOOP_TICK_SECONDS)

    def overdue(self) -> str | None:
        """Why /healthz fails: no heartbeat renewed the leases for a whole lease while
        attempts are held (None when one did, or nothing is held)."""
        since = time.monotonic() - self.last_ok
        if len(self.keeper) and since >= self.keeper.lease_seconds:
            return (
                f"no heartbeat succeeded for {since:.0f}s (the lease is"
                f" {self.keeper.lease_seconds:g}s) while {len(self.keeper)} attempts are held"
            )
        return None

    # -- the thread ---------------------------------------------------------------
    def _run(self) -> None:
        next_beat = time.monotonic() + self.interval
        next_probe = time.monotonic()
        while not self._stop.wait(min(LOOP_TICK_SECONDS * 5, self.interval)):
            self.watch_loop()
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.interval
                self.beat()
            if self.floor is not None and time.monotonic() >= next_probe:
                next_probe = time.monotonic() + self.floor.PROBE_SECONDS
                self.probe_floor()

    def probe_floor(self) -> None:
        """Move the claims' start back to any job ready behind it. A failure costs only
        the delay of such a job: the next probe tries again."""
        assert self.floor is not None
        try:
            conn = self._connection()
            with self.deadlines.watch(conn):
                moved = self.floor.probe(conn)
            self.probes += 1
        except DatabaseUnavailable as exc:
            self._close()
            log.warning("claim floor probe failed (%s)", exc)
            return
        except DatabaseError as exc:
            log.error("claim floor probe refused (%s)", exc)
            return
        if moved:
            log.debug("jobs ready behind the claims' start at priorities %s", moved)
            self.wake_claims()

    def watch_loop(self, now: float | None = None) -> bool:
        """Count and log a stall of the event loop (once per stall); True while stalled."""
        now = time.monotonic() if now is None else now
        blocked = now - self.loop_tick
        if blocked < self.loop_stall_seconds:
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

    def beat(self) -> None:
        """Renew every held lease once, then let the event loop stop the attempts whose
        lease is gone or whose job somebody asked to cancel."""
        executions = self.keeper.snapshot()
        keys = {e.key for e in executions}
        if not keys:
            self.last_ok = time.monotonic()
            return
        try:
            leases, unknown = self._extend(keys)
        except DatabaseUnavailable as exc:
            self._close()
            log.warning("heartbeat failed (%s); leases run on until the next one", exc)
            return
        if not unknown:
            self.last_ok = time.monotonic()
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
                self._loop.call_soon_threadsafe(self.keeper.apply, executions, leases, unknown)

    def _extend(self, keys: set[Key]) -> tuple[list[claims.Lease], set[Key]]:
        """Extend `keys` in one statement; if it is refused (a row locked past the lock
        timeout by a handler's own transaction, say), one key per statement, so one
        locked row holds back no other lease. Keys still refused are unknown: not
        renewed this time, and not taken for lost."""
        try:
            return self._extend_some(keys), set()
        except DatabaseError as exc:
            log.error("heartbeat refused (%s); renewing the leases one at a time", exc)
        leases: list[claims.Lease] = []
        unknown: set[Key] = set()
        for key in sorted(keys):
            try:
                leases.extend(self._extend_some({key}))
            except DatabaseError as exc:
                log.error("job %s attempt %s: heartbeat refused (%s)", *key, exc)
                unknown.add(key)
        return leases, unknown

    def _extend_some(self, keys: set[Key]) -> list[claims.Lease]:
        conn = self._connection()
        with self.deadlines.watch(conn):
            return claims.extend_leases(
                conn, self.keeper.worker_id, keys, self.keeper.lease_seconds
            )

    def _connection(self) -> db.Conn:
        if self._conn is None or self._conn.closed:
            self._conn = self.deadlines.connect(
                self.dsn, "rota-worker-heartbeat", lock_timeout=True
            )
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
