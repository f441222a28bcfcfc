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

A service that takes work away from workers (the reaper) has a recovery grace:
after its passes failed, the database must have answered it again for that long
before it runs full passes (`Recovery`). Workers that lived through the same
outage first renew the leases and write the outcomes they held: a lease is not
taken from a worker for the time the database was away from both.
"""

from __future__ import annotations

import abc
import enum
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from rota import db
from rota.deadlines import Deadlines
from rota.errors import RotaError, one_line
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
    recovery_grace_seconds: float = 0.0
    """After failed passes, how long the database must have answered again before
    a full pass (`run_recovering` meanwhile); 0: at once."""

    @property
    @abc.abstractmethod
    def interval_seconds(self) -> float:
        """The longest wait between passes, and the wait after a failed one."""

    @abc.abstractmethod
    def run_once(self, conn_or_dsn: db.ConnOrDsn, now: datetime | None = None) -> Result:
        """One pass; `now` freezes the clock for tests (default: the database's)."""

    def run_recovering(self, conn_or_dsn: db.ConnOrDsn, now: datetime | None = None) -> Result:
        """A pass during the recovery grace: what is safe at once after an outage
        (the whole pass unless the service says otherwise)."""
        return self.run_once(conn_or_dsn, now)

    def failed(self, exc: BaseException) -> None:  # noqa: B027 - a hook most services ignore
        """A pass failed, connecting for it included (its loop tells; a service
        that reports readiness listens)."""

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


class Phase(enum.Enum):
    """Where a service loop stands with respect to outages."""

    STEADY = "steady"
    """Passes work: each is a full pass."""
    AWAY = "away"
    """The last pass failed (the database away, or refusing the pass)."""
    RECOVERING = "recovering"
    """A pass worked again after failed ones; full passes wait for the grace."""


class Recovery:
    """The recovery grace of a loop (see the module's docstring): one phase, moved
    by `failed` and `full_pass`; time from `clock` (monotonic seconds)."""

    def __init__(
        self, grace_seconds: float, clock: Callable[[], float], away: bool = False
    ) -> None:
        self.grace_seconds = grace_seconds
        self.clock = clock
        self.phase = Phase.AWAY if away else Phase.STEADY
        self.back_at = 0.0
        """When the first pass after failed ones began (in RECOVERING)."""

    def failed(self) -> None:
        self.phase = Phase.AWAY

    def full_pass(self) -> bool:
        """Whether the pass about to run is a full one; moves AWAY to RECOVERING (the
        grace starts now) and RECOVERING to STEADY once the grace is over."""
        if self.phase is Phase.AWAY:
            self.phase, self.back_at = Phase.RECOVERING, self.clock()
        if self.phase is Phase.RECOVERING and self.left() <= 0:
            self.phase = Phase.STEADY
        return self.phase is Phase.STEADY

    def left(self) -> float:
        """Seconds of the grace still to run (0 out of RECOVERING)."""
        if self.phase is not Phase.RECOVERING:
            return 0.0
        return max(self.back_at + self.grace_seconds - self.clock(), 0.0)


class ServiceLoop(Loop):
    """A service's passes on the one loop shape (`rota.loops.Loop`): its own
    connection with the answer deadline, LISTENing on the wake channel; after a
    pass, at once if it was capped, else after the service's `next_wait` (at
    least `IDLE_WAIT_FLOOR_SECONDS` if it acted on nothing) or a NOTIFY. After
    failed passes, `recovery` holds full passes back for the service's grace
    (`away`: the loop starts as after failed passes, its owner having waited
    for the database); `clock` is for tests."""

    log = log
    run_at_start = True

    def __init__(
        self,
        service: Service,
        dsn: str,
        stop: threading.Event,
        deadlines: Deadlines,
        *,
        away: bool = False,
        clock: Callable[[], float] = time.monotonic,
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
        self.recovery = Recovery(service.recovery_grace_seconds, clock, away)

    def run_once(self) -> None:
        self.result = None
        conn = self.connection()
        before = self.recovery.phase
        if self.recovery.full_pass():
            self.result = result = self.service.run_once(conn)
            if before is Phase.RECOVERING:
                self.log.info("%s: the recovery grace is over; full passes again", self.name)
        else:
            self.result = result = self.service.run_recovering(conn)
            if before is Phase.AWAY:
                self.log.warning(
                    "%s: the database answers again; full passes wait %gs, for workers"
                    " to renew the leases and write the outcomes they held meanwhile",
                    self.name,
                    self.recovery.grace_seconds,
                )
        if result.count:
            self.log.info("%s: %s", self.service.name, result)

    def failed(self, exc: BaseException) -> None:
        self.recovery.failed()
        self.service.failed(exc)

    def connected(self, conn: db.Conn) -> None:
        if self.service.wake_channel is not None:
            db.listen(conn, self.service.wake_channel)

    def next_wait(self) -> float:
        result = self.result
        if result is None or result.capped:
            return 0.0
        if self.recovery.phase is Phase.RECOVERING:
            return min(self.recovery.left(), self.interval) + 0.01
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
            self.log.warning("%s: waiting failed (%s)", self.name, one_line(exc))
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
    away: bool = False,
) -> list[Result]:
    """Run `service` until `stop` is set, logging what each pass did.

    With `once`, run passes until one is not capped and return their results;
    a failure then raises instead of being logged and retried. The service's
    connection carries the timeouts of `connection` (the defaults when None),
    and every wait for an answer on it has the answer deadline (kept by
    `deadlines`, a watchdog of its own when None): a connection that stops
    answering ends the pass as an outage, and the next pass opens a new one
    (after the loop's backoff: 0.1 s doubling up to the service's interval).
    `away`: the caller waited for the database, as after failed passes (see
    `Recovery`).
    """
    loop = ServiceLoop(service, dsn, stop, deadlines or Deadlines(connection), away=away)
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
    away: bool = False,
) -> ServiceLoop:
    """`service`'s loop in a daemon thread of its own, until `stop` is set."""
    loop = ServiceLoop(service, dsn, stop, deadlines or Deadlines(connection), away=away)
    loop.start()
    return loop
