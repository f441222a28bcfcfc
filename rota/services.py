"""Background services and the one loop that runs any of them.

A service (the reaper, the scheduler, the archiver) is one module holding its
documented settings dataclass, a `run_once(conn, now=None)` that does one pass
and returns a typed result, and optionally a wake channel: a NOTIFY on it ends
the wait before the next pass. `run_loop` is all the looping there is: the
`rota reaper`, `rota scheduler` and `rota archive` commands call it, and so do
workers, one thread per service. Tests call `run_once` with a frozen clock.
Every service is safe to run in many processes at once (SKIP LOCKED, capped
batches, idempotency keys), so a loop never coordinates with other loops.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from datetime import datetime
from typing import Protocol

from rota import db
from rota.deadlines import Deadlines
from rota.errors import RotaError
from rota.settings import ConnectionSettings

log = logging.getLogger("rota.services")

IDLE_WAIT_FLOOR_SECONDS = 0.5
"""After a pass that acted on nothing, wait at least this long, whatever
`next_wait` says: work that looks due but is held by another process (a row
locked by a scheduler that froze mid-pass) must not make a loop spin."""


class Result(Protocol):
    """What one pass of a service did."""

    @property
    def count(self) -> int:
        """Things acted on; a pass that acted on nothing is not logged."""
        ...

    @property
    def capped(self) -> bool:
        """The pass stopped at its cap: more work is waiting, run again at once."""
        ...


class Service(abc.ABC):
    name: str
    """Shown in logs and in the application_name of the service's connection."""
    wake_channel: str | None = None
    """A NOTIFY channel that ends the wait before the next pass."""

    @property
    @abc.abstractmethod
    def interval_seconds(self) -> float:
        """The longest wait between passes, and the wait after a failed one."""

    @abc.abstractmethod
    def run_once(self, conn_or_dsn: db.ConnOrDsn, now: datetime | None = None) -> Result:
        """One pass; `now` freezes the clock for tests (default: the database's)."""

    def next_wait(self, conn: db.Conn) -> float:
        """Seconds to wait before the next pass (a service may know it sooner)."""
        return self.interval_seconds


def run_loop(
    service: Service,
    dsn: str,
    stop: threading.Event,
    *,
    once: bool = False,
    connection: ConnectionSettings | None = None,
    deadlines: Deadlines | None = None,
) -> list[Result]:
    """Run `service` until `stop` is set, logging what each pass did.

    With `once`, run passes until one is not capped and return their results;
    a failure then raises instead of being logged and retried. The service's
    connection carries the timeouts of `connection` (the defaults when None),
    and every wait for an answer on it has the answer deadline (kept by
    `deadlines`, a watchdog of its own when None): a connection that stops
    answering ends the pass as an outage, and the next pass opens a new one.
    """
    deadlines = deadlines or Deadlines(connection)
    results: list[Result] = []
    conn: db.Conn | None = None
    try:
        while not stop.is_set():
            try:
                if conn is None:
                    conn = _connect(service, dsn, deadlines)
                result = service.run_once(conn)
                if once or result.count:
                    log.info("%s: %s", service.name, result)
                if once:
                    results.append(result)
                    if not result.capped:
                        return results
                elif not result.capped:
                    _wait(service, conn, stop, idle=not result.count)
            except RotaError as exc:
                if once:
                    raise
                log.warning("%s failed: %s", service.name, exc)
                if conn is not None and db.is_unavailable(exc):
                    conn.close()
                    conn = None
                stop.wait(service.interval_seconds)
    finally:
        if conn is not None:
            conn.close()
    return results


def start_thread(
    service: Service,
    dsn: str,
    stop: threading.Event,
    connection: ConnectionSettings | None = None,
    deadlines: Deadlines | None = None,
) -> threading.Thread:
    """`run_loop` in a daemon thread of its own, until `stop` is set."""
    thread = threading.Thread(
        target=run_loop,
        args=(service, dsn, stop),
        kwargs={"connection": connection, "deadlines": deadlines},
        name=f"rota-{service.name}",
        daemon=True,
    )
    thread.start()
    return thread


def _connect(service: Service, dsn: str, deadlines: Deadlines) -> db.Conn:
    conn = deadlines.connect(dsn, f"rota-{service.name}", each_answer=True)
    if service.wake_channel is not None:
        db.listen(conn, service.wake_channel)
    return conn


def _wait(service: Service, conn: db.Conn, stop: threading.Event, idle: bool) -> None:
    """Until the next pass is due, `stop` is set or the wake channel is notified."""
    wait = service.next_wait(conn)
    end = time.monotonic() + (max(wait, IDLE_WAIT_FLOOR_SECONDS) if idle else wait)
    if service.wake_channel is None:
        stop.wait(max(0.0, end - time.monotonic()))
        return
    with db.errors_wrapped():
        while not stop.is_set() and (left := end - time.monotonic()) > 0:
            for _ in conn.notifies(timeout=min(left, 0.5), stop_after=1):
                return
