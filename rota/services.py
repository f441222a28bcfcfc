"""Background services and the one loop that runs any of them.

A service (the reaper, the scheduler, the archiver) is one module holding its
documented settings dataclass, a `run_once(conn, now=None)` that does one pass
and returns a typed result, and optionally a wake channel: a NOTIFY on it ends
the wait before the next pass. `run_loop` is all the looping there is: the
`rota reaper`, `rota scheduler` and `rota archive` commands call it, and so do
workers, one thread per service; it turns the service on the one loop shape
(`rota.loops.Loop`, as `ServiceLoop`), with its backoff. Tests call `run_once` with a frozen clock.
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
from rota.loops import Loop
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

    def wait_until_due(
        self, conn: db.Conn, query: str, params: dict[str, object] | None = None
    ) -> float:
        """`next_wait` from `query`, whose one row's `wait` (an interval, NULL for
        nothing due) says how long until the next thing to do: just past it,
        at once if it has passed, and never longer than the interval."""
        with db.connection(conn) as c:
            rows = db.fetch_all(c, query, params)
        wait = self.interval_seconds
        if rows and rows[0]["wait"] is not None:
            wait = min(wait, max(rows[0]["wait"].total_seconds(), 0.0) + 0.01)
        return wait


class ServiceLoop(Loop):
    """A service's passes on the one loop shape (`rota.loops.Loop`): its own
    connection with the answer deadline, LISTENing on the wake channel; after a
    pass, at once if it was capped, else after the service's `next_wait` (at
    least `IDLE_WAIT_FLOOR_SECONDS` if it acted on nothing) or a NOTIFY."""

    log = log
    run_at_start = True

    def __init__(
        self,
        service: Service,
        dsn: str,
        stop: threading.Event,
        deadlines: Deadlines,
    ) -> None:
        name = f"rota-{service.name}"
        super().__init__(
            service.interval_seconds,
            connect=lambda: deadlines.connect(dsn, name, each_answer=True),
            reconnect_max_seconds=service.interval_seconds,
            stop=stop,
        )
        self.name = name
        self.service = service
        self.result: Result | None = None
        """What the last pass did."""

    def run_once(self) -> None:
        self.result = None
        self.result = result = self.service.run_once(self.connection())
        if result.count:
            self.log.info("%s: %s", self.service.name, result)

    def connected(self, conn: db.Conn) -> None:
        if self.service.wake_channel is not None:
            db.listen(conn, self.service.wake_channel)

    def next_wait(self) -> float:
        result = self.result
        if result is None or result.capped:
            return 0.0
        wait = self.service.next_wait(self.connection())
        return max(wait, IDLE_WAIT_FLOOR_SECONDS) if not result.count else wait

    def wait(self, seconds: float) -> bool:
        """Until the next pass is due, stopped, or the wake channel is notified."""
        conn = self._conn
        if self.service.wake_channel is None or conn is None or conn.closed:
            return super().wait(seconds)
        end = time.monotonic() + seconds
        try:
            with db.errors_wrapped():
                while not self.stopping and (left := end - time.monotonic()) > 0:
                    for _ in conn.notifies(timeout=min(left, 0.5), stop_after=1):
                        return self.stopping
        except RotaError as exc:  # the next pass opens a new connection
            self.log.warning("%s: waiting failed (%s)", self.name, exc)
            if db.is_unavailable(exc):
                self.close()
        return self.stopping


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
    answering ends the pass as an outage, and the next pass opens a new one
    (after the loop's backoff: 0.1 s doubling up to the service's interval).
    """
    loop = ServiceLoop(service, dsn, stop, deadlines or Deadlines(connection))
    if not once:
        loop.run()
        return []
    results: list[Result] = []
    try:
        while not stop.is_set():
            loop.run_once()
            assert loop.result is not None
            results.append(loop.result)
            if not loop.result.count:  # a pass that acted on something logged itself
                log.info("%s: %s", service.name, loop.result)
            if not loop.result.capped:
                break
    finally:
        loop.close()
    return results


def start_thread(
    service: Service,
    dsn: str,
    stop: threading.Event,
    connection: ConnectionSettings | None = None,
    deadlines: Deadlines | None = None,
) -> ServiceLoop:
    """`service`'s loop in a daemon thread of its own, until `stop` is set."""
    loop = ServiceLoop(service, dsn, stop, deadlines or Deadlines(connection))
    loop.start()
    return loop
