"""The archiver: moves finished jobs out of rota.job into rota.job_archive.

Done rows pile up; claiming never reads them (partial indexes), but the table
and its vacuuming grow. The archiver moves done rows after `done_retention`,
and failed/dead rows after a longer `failed_retention`, in capped batches of
one short statement each, so it never holds locks that workers would wait on.
An idempotency key lives in rota.job's unique index only while its row is
there: the key's idempotency window equals the retention of its row.

It runs as the built-in schedule ``rota/archive`` (job type ``rota.archive``,
settings in the schedule's payload) and as ``rota archive``. It never touches
ready or running jobs.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from rota import sql
from rota.db import ConnOrDsn, connection, fetch_all
from rota.errors import InvalidInput, Permanent
from rota.handlers import Context, handler
from rota.jobs import Job, Status
from rota.services import Service

log = logging.getLogger(__name__)

JOB_TYPE = "rota.archive"
SCHEDULE_NAME = "rota/archive"
_DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class ArchiveSettings:
    done_retention_seconds: float = 7 * _DAY
    """How long a done row stays in rota.job, in seconds after it finished: also
    how long its idempotency key keeps refusing a second job."""

    failed_retention_seconds: float = 30 * _DAY
    """How long failed, dead and cancelled rows stay, in seconds after they finished: long
    enough to read their errors and retry them."""

    batch_size: int = 1000
    """Rows moved per statement: each batch is one short transaction."""

    max_batches: int = 100
    """Batches per run; what is left waits for the next run (every 5 minutes by default)."""

    def __post_init__(self) -> None:
        if self.done_retention_seconds < 0 or self.failed_retention_seconds < 0:
            raise InvalidInput("archive retentions must not be negative")
        if self.batch_size < 1 or self.max_batches < 1:
            raise InvalidInput("archive batch_size and max_batches must be at least 1")

    @classmethod
    def from_payload(cls, payload: Any) -> ArchiveSettings:
        """Settings from a ``rota.archive`` job's payload (any field may be left out)."""
        values = payload or {}
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(values, dict) or set(values) - known:
            raise InvalidInput(f"archive payload takes only the keys {sorted(known)}")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ArchiveResult:
    done: int = 0
    """Done rows moved."""
    failed: int = 0
    """Failed, dead and cancelled rows moved."""
    batches: int = 0
    """Statements run."""
    capped: bool = False
    """True when max_batches stopped the run: rows may be left for the next run."""

    @property
    def count(self) -> int:
        return self.done + self.failed


class Archiver(Service):
    name = "archiver"
    interval_seconds = 300.0
    """As often as the built-in schedule runs it."""

    def __init__(self, settings: ArchiveSettings | None = None) -> None:
        self.settings = settings or ArchiveSettings()

    def run_once(self, conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> ArchiveResult:
        """Move what is old enough, batch by batch, up to max_batches statements."""
        s = self.settings
        kinds = [
            ([Status.DONE], s.done_retention_seconds),
            ([Status.FAILED, Status.DEAD, Status.CANCELLED], s.failed_retention_seconds),
        ]
        moved = [0, 0]
        batches, capped = 0, False
        with connection(conn_or_dsn) as conn:
            for kind, (statuses, retention) in enumerate(kinds):
                while True:
                    if batches == s.max_batches:
                        capped = True
                        break
                    params = {
                        "now": now,
                        "statuses": statuses,
                        "retention": retention,
                        "limit": s.batch_size,
                    }
                    count = int(fetch_all(conn, sql.query("archive_finished"), params)[0]["moved"])
                    moved[kind], batches = moved[kind] + count, batches + 1
                    if count < s.batch_size:
                        break
        return ArchiveResult(moved[0], moved[1], batches, capped)


@handler(JOB_TYPE)
def archive_job(job: Job, ctx: Context) -> None:
    """The built-in schedule's job: archive with the settings in its payload."""
    try:
        settings = ArchiveSettings.from_payload(job.payload)
    except (InvalidInput, TypeError) as exc:
        raise Permanent(f"bad archive settings: {exc}") from None
    result = Archiver(settings).run_once(ctx.dsn)
    log.info("archived %d done and %d failed/dead jobs", result.done, result.failed)
