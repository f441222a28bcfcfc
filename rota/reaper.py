"""The reaper: gives back jobs whose worker stopped renewing its lease.

A running row whose locked_until has passed (by the database clock) goes back
to ready, or to dead when its attempts are used up; each one is counted in
``rota.lease_expiration`` by UTC hour. Capped batches under SKIP LOCKED let any
number of reapers run at once without waiting on each other or doubling a reset.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from rota import sql
from rota.db import ConnOrDsn, connection, fetch_all
from rota.settings import ReaperSettings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ReapResult:
    requeued: list[int]
    """Jobs given back to ready."""
    dead: list[int]
    """Jobs whose expired attempt was their last."""

    @property
    def count(self) -> int:
        return len(self.requeued) + len(self.dead)


class Reaper:
    name = "reaper"

    def __init__(self, settings: ReaperSettings | None = None) -> None:
        settings = settings or ReaperSettings()
        self.settings = settings
        self.interval_seconds = settings.interval_seconds

    def run_once(self, conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> ReapResult:
        """Reset expired leases, batch after batch, until none is left."""
        requeued: list[int] = []
        dead: list[int] = []
        with connection(conn_or_dsn) as conn:
            while True:
                rows = fetch_all(
                    conn, sql.query("reap_expired"), {"limit": self.settings.batch_size, "now": now}
                )
                for row in rows:
                    (dead if row["status"] == "dead" else requeued).append(row["id"])
                    log.warning(
                        "lease expired: job %s (%s) is now %s",
                        row["id"],
                        row["type"],
                        row["status"],
                    )
                if len(rows) < self.settings.batch_size:
                    break
        return ReapResult(requeued, dead)
