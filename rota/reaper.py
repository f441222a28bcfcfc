"""The reaper: gives back jobs whose worker stopped renewing its lease, and
makes waiting jobs whose time came ready again (durable jobs' sleeps and timeouts).

A running row whose locked_until has passed (by the database clock) goes back
to ready after the job's backoff (its attempt counted, as for a failing job: a
job that kills its worker backs off instead of coming back at once), to dead
when its attempts are used up, or to cancelled when somebody asked to cancel
it; each one is counted in ``rota.lease_expiration`` by UTC hour. Capped
batches under SKIP LOCKED let any number of reapers run at once without
waiting on each other or doubling a reset.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from rota import limits, sql
from rota.db import Conn, ConnOrDsn, connection, fetch_all
from rota.durable import wake_due, wake_rechecked
from rota.errors import InvalidInput
from rota.jobs import Status
from rota.retry import MAX_RELEASES
from rota.services import Service
from rota.settings import BackoffSettings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ReaperSettings:
    interval_seconds: float = 5.0
    """How often the reaper looks for expired leases, in seconds."""

    batch_size: int = 1000
    """Most rows reset per statement: keeps each transaction and its locks short."""

    max_batches: int = 100
    """Batches per pass; a pass that hits it is followed by another at once."""

    backoff: BackoffSettings = dataclasses.field(default_factory=BackoffSettings)
    """The retry delays of an expired job, as for a failed attempt (a worker's
    reaper uses the worker's own backoff)."""

    recovery_grace_seconds: float = 30.0
    """After failed passes (the database away, or taking no writes), how long the
    database must have answered the reaper again before it gives back expired
    leases, in seconds. A lease that ran out during an outage ran out for its
    worker too, which could neither renew it nor write the outcome it holds;
    workers retry within their reconnect backoff (at most 10 s by default),
    plus a connect timeout (5 s), and then renew and write at once. The default
    leaves that twice over. Meanwhile the reaper still wakes waiting jobs that
    came due. 0: no grace. A reaper that starts with the database up reaps at once."""

    def __post_init__(self) -> None:
        limits.interval_seconds(self.interval_seconds, "reaper interval")
        limits.delay_seconds(self.recovery_grace_seconds, "reaper recovery grace")
        if self.batch_size < 1 or self.max_batches < 1:
            raise InvalidInput("reaper needs batch_size >= 1 and max_batches >= 1")


@dataclasses.dataclass(frozen=True)
class ReapResult:
    requeued: list[int] = dataclasses.field(default_factory=list)
    """Jobs given back to ready."""
    dead: list[int] = dataclasses.field(default_factory=list)
    """Jobs whose expired attempt was their last."""
    cancelled: list[int] = dataclasses.field(default_factory=list)
    """Jobs somebody had asked to cancel: they end cancelled, not ready."""
    capped: bool = False
    """max_batches stopped the pass: more expired leases may be waiting."""
    woken: list[int] = dataclasses.field(default_factory=list)
    """Waiting jobs whose time came (a sleep ended, a wait timed out): ready again."""

    @property
    def count(self) -> int:
        return len(self.requeued) + len(self.dead) + len(self.cancelled)

    def __str__(self) -> str:
        """The log line: what the pass did, in words."""
        return (
            f"{self.count} expired lease(s): {len(self.requeued)} job(s) ready again,"
            f" {len(self.dead)} dead, {len(self.cancelled)} cancelled"
            + ("; more waiting" if self.capped else "")
            + (f"; {len(self.woken)} waiting job(s) due" if self.woken else "")
        )


class Reaper(Service):
    name = "reaper"

    def __init__(self, settings: ReaperSettings | None = None) -> None:
        self.settings = settings or ReaperSettings()

    @property
    def interval_seconds(self) -> float:
        return self.settings.interval_seconds

    @property
    def recovery_grace_seconds(self) -> float:  # type: ignore[override]
        return self.settings.recovery_grace_seconds

    def next_wait(self, conn: Conn) -> float:
        """Until the earliest lease expires or waiting job comes due, at most the
        interval: a dead worker's job is back within its lease, not a pass later."""
        return self.wait_until_due(conn, sql.query("reaper_next_due"))

    def run_once(self, conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> ReapResult:
        """Reset expired leases, batch after batch, until none is left (or the cap)."""
        found: dict[Status, list[int]] = {Status.READY: [], Status.DEAD: [], Status.CANCELLED: []}
        capped = True
        with connection(conn_or_dsn) as conn:
            for _ in range(self.settings.max_batches):
                rows = fetch_all(conn, sql.query("reap_expired"), self._params(now))
                for row in rows:
                    found[Status(row["status"])].append(row["id"])
                    log.warning(
                        "lease expired: job %s (%s) is now %s",
                        row["id"],
                        row["type"],
                        row["status"],
                    )
                if len(rows) < self.settings.batch_size:
                    capped = False
                    break
            woken = self._wake_due(conn, now)
        return ReapResult(
            found[Status.READY], found[Status.DEAD], found[Status.CANCELLED], capped, woken
        )

    def run_recovering(self, conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> ReapResult:
        """A pass of the recovery grace: expired leases are left to their workers,
        waiting jobs that came due are woken (a write: it also tells whether the
        database takes writes again)."""
        with connection(conn_or_dsn) as conn:
            return ReapResult(capped=False, woken=self._wake_due(conn, now))

    def _wake_due(self, conn: Conn, now: datetime | None) -> list[int]:
        """Waiting jobs whose time came are ready again (rota.durable.wake_due), and
        those an emit could not see (rota.durable.wake_rechecked)."""
        woken: list[int] = []
        for _ in range(self.settings.max_batches):
            batch = wake_due(conn, now, self.settings.batch_size)
            woken += batch
            if len(batch) < self.settings.batch_size:
                break
        return woken + wake_rechecked(conn, self.settings.batch_size)

    def _params(self, now: datetime | None) -> dict[str, object]:
        backoff = self.settings.backoff
        return {
            "limit": self.settings.batch_size,
            "now": now,
            "base": backoff.base_seconds,
            "cap": backoff.cap_seconds,
            "jitter": backoff.jitter,
            "max_releases": MAX_RELEASES,
        }
