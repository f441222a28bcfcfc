"""The archiver: moves finished jobs out of rota.job into rota.job_archive.

Done rows pile up; claiming never reads them (partial indexes), but the table
and its vacuuming grow. The archiver moves done rows after `done_retention`,
and failed/dead rows after a longer `failed_retention`, in capped batches of
one short statement each, so it never holds locks that workers would wait on.
An idempotency key lives in rota.job's unique index only while its row is
there: the key's idempotency window equals the retention of its row. With an
`archive_retention`, the same run then deletes archived rows older than it;
without one (the default), rota.job_archive keeps them. Last, it deletes the
keys of unique_for whose window has passed (rota.job_unique_key), which would
otherwise pile up for good: never one whose window may still refuse a job
(rota/sql/archive.sql says how).

It runs as the built-in schedule ``rota/archive`` (job type ``rota.archive``,
settings in the schedule's payload) and as ``rota archive``. It never touches
ready, running or waiting jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql as psycopg_sql

from rota import sql
from rota.db import Conn, ConnOrDsn, connection, fetch_all
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

    archive_retention_seconds: float | None = None
    """How long an archived row stays in rota.job_archive, in seconds after it
    was archived, before it is deleted; None keeps archived rows for good. The
    children of a job still in rota.job stay while it is there: it reads their
    outcomes on every run, and one that ended dead or failed may be retried."""

    unique_key_retention_seconds: float = 3600.0
    """How long a unique_for key's row stays after its window has passed, in
    seconds, before it is deleted. The window is over either way (an enqueue then
    makes a new job); the row is kept for an enqueue whose transaction began
    inside the window and judges the key by that instant."""

    event_retention_seconds: float = 30 * _DAY
    """How long an emitted event (rota.emit) stays, in seconds after its first emit:
    until then a `wait_for` of its key returns its payload at once, and a later
    emit of the key changes nothing; after, the key is new again."""

    batch_size: int = 1000
    """Rows moved per statement: each batch is one short transaction."""

    max_batches: int = 100
    """Batches per run; what is left waits for the next run (every 5 minutes by default)."""

    rebuild_bloated_indexes: bool = True
    """Rebuild (REINDEX CONCURRENTLY) the indexes of rota.job that grew far past
    what their entries need, as a long transaction leaves them; see
    `rebuild_bloated_indexes`."""

    def __post_init__(self) -> None:
        retentions = [
            self.done_retention_seconds,
            self.failed_retention_seconds,
            self.unique_key_retention_seconds,
            self.event_retention_seconds,
        ]
        if self.archive_retention_seconds is not None:
            retentions.append(self.archive_retention_seconds)
        if any(r < 0 for r in retentions):
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
        for name, value in values.items():
            if name == "rebuild_bloated_indexes":
                if not isinstance(value, bool):
                    raise InvalidInput(f"{name} must be true or false, not {value!r}")
                continue
            whole = name in ("batch_size", "max_batches")
            kinds = int if whole else (int, float)
            if value is None and name == "archive_retention_seconds":
                continue
            if isinstance(value, bool) or not isinstance(value, kinds):
                kind = "a whole number" if whole else "a number of seconds"
                raise InvalidInput(f"{name} must be {kind}, not {value!r}")
        return cls(**values)


def check_schedule(job_type: str, payload: Any) -> None:
    """Refuse a schedule of archive jobs whose payload the archiver would refuse at
    every run (`rota schedule add` and the operator's JobSchedule both ask)."""
    if job_type != JOB_TYPE:
        return
    try:
        ArchiveSettings.from_payload(payload)
    except InvalidInput as exc:
        raise InvalidInput(f"payload of a {JOB_TYPE} schedule: {exc}") from None


@dataclasses.dataclass(frozen=True)
class ArchiveResult:
    done: int = 0
    """Done rows moved."""
    failed: int = 0
    """Failed, dead and cancelled rows moved."""
    batches: int = 0
    """Statements run that moved or deleted jobs (those deleting keys have a cap
    of their own)."""
    capped: bool = False
    """True when max_batches stopped the run: rows may be left for the next run."""
    deleted: int = 0
    """Archived rows deleted after the archive retention."""
    keys: int = 0
    """Keys of unique_for deleted, their window passed (rota.job_unique_key)."""
    events: int = 0
    """Emitted events deleted after their retention (rota.job_event)."""
    rebuilt: tuple[str, ...] = ()
    """Indexes of rota.job rebuilt, bloated."""
    vacuumed: bool = False
    """rota.job vacuumed, its file far past what its rows need (see `vacuum_bloated_table`)."""

    @property
    def count(self) -> int:
        return self.done + self.failed

    def __str__(self) -> str:
        """The log line: what the run did, in words."""
        return (
            f"archived {self.done} done and {self.failed} failed/dead jobs;"
            f" deleted {self.deleted} archived jobs"
            + (f" and {self.keys} expired unique keys" if self.keys else "")
            + (f" and {self.events} old events" if self.events else "")
            + ("; more waiting" if self.capped else "")
            + ("; vacuumed the bloated table" if self.vacuumed else "")
            + (f"; rebuilt the bloated indexes {', '.join(self.rebuilt)}" if self.rebuilt else "")
        )


class Archiver(Service):
    name = "archiver"
    interval_seconds = 300.0
    """As often as the built-in schedule runs it."""

    def __init__(self, settings: ArchiveSettings | None = None) -> None:
        self.settings = settings or ArchiveSettings()

    def run_once(self, conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> ArchiveResult:
        """Move what is old enough, then delete archived rows past the archive
        retention (if one is set), batch by batch, up to max_batches statements
        in all; then delete expired unique keys, up to max_batches statements more."""
        s = self.settings
        steps: list[tuple[str, dict[str, Any]]] = [
            (
                "archive_finished",
                {"statuses": [Status.DONE], "retention": s.done_retention_seconds},
            ),
            (
                "archive_finished",
                {
                    "statuses": [Status.FAILED, Status.DEAD, Status.CANCELLED],
                    "retention": s.failed_retention_seconds,
                },
            ),
        ]
        if s.archive_retention_seconds is not None:
            steps.append(("delete_archived", {"retention": s.archive_retention_seconds}))
        counts = [0, 0, 0]
        batches, capped = 0, False
        with connection(conn_or_dsn) as conn:
            for step, (query, params) in enumerate(steps):
                while not capped:
                    if batches == s.max_batches:
                        capped = True
                        break
                    count = self._batch(conn, query, {**params, "now": now})
                    counts[step], batches = counts[step] + count, batches + 1
                    if count < s.batch_size:
                        break
            keys, keys_capped = self._expired_keys(conn, now)
            events, events_capped = self._old_events(conn, now)
            # The rows just archived may have been the last at the table's end:
            # vacuum then gives the end back, and counts the entries the
            # rebuild's choice reads.
            vacuumed = s.rebuild_bloated_indexes and vacuum_bloated_table(conn)
            rebuilt = rebuild_bloated_indexes(conn) if s.rebuild_bloated_indexes else ()
        return ArchiveResult(
            counts[0],
            counts[1],
            batches,
            capped or keys_capped or events_capped,
            deleted=counts[2],
            keys=keys,
            events=events,
            rebuilt=rebuilt,
            vacuumed=vacuumed,
        )

    def _expired_keys(self, conn: Conn, now: datetime | None) -> tuple[int, bool]:
        """Delete expired unique keys: how many, and whether max_batches stopped it."""
        s = self.settings
        params = {"retention": s.unique_key_retention_seconds, "now": now}
        deleted = 0
        for _ in range(s.max_batches):
            count = self._batch(conn, "delete_expired_unique_keys", params)
            deleted += count
            if count < s.batch_size:
                return deleted, False
        return deleted, True

    def _old_events(self, conn: Conn, now: datetime | None) -> tuple[int, bool]:
        """Delete events past their retention: how many, and whether max_batches stopped it."""
        params = {"retention": self.settings.event_retention_seconds, "now": now}
        deleted = 0
        for _ in range(self.settings.max_batches):
            count = self._batch(conn, "delete_old_events", params)
            deleted += count
            if count < self.settings.batch_size:
                return deleted, False
        return deleted, True

    def _batch(self, conn: Conn, query: str, params: dict[str, Any]) -> int:
        """One capped batch of `query`: the rows it moved or deleted."""
        values = {**params, "limit": self.settings.batch_size}
        return int(fetch_all(conn, sql.query(query), values)[0]["moved"])


REBUILD_FACTOR = 4
"""An index is bloated past this many times the pages its entries need packed."""
REBUILD_MIN_PAGES = 256
"""Smaller indexes (2 MiB of 8 KiB pages) are never rebuilt."""
REBUILD_TABLE_SHARE = 0.1
"""Nor one whose pages to give back are fewer than this share of the pages the
table's live rows fill: a rebuild reads the whole table twice."""
REBUILD_QUIET_SECONDS = 10.0
"""No rebuild while another transaction of the database is older than this: a
rebuild waits for every transaction older than itself, as long as the lock
timeout below lets it."""
REBUILD_TIMEOUTS = {"statement_timeout": "10min", "lock_timeout": "10s"}
VACUUM_FACTOR = 4
"""rota.job is vacuumed by the archive when its file is past this many times the
pages its live rows fill (and REBUILD_MIN_PAGES more)."""


@contextlib.contextmanager
def _maintenance_timeouts(conn: Conn) -> Iterator[None]:
    """REBUILD_TIMEOUTS on `conn` inside the block, its own settings again after."""
    saved = {
        name: fetch_all(conn, "SELECT current_setting(%(name)s) AS value", {"name": name})[0][
            "value"
        ]
        for name in REBUILD_TIMEOUTS
    }
    try:
        for name, value in REBUILD_TIMEOUTS.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        yield
    finally:
        for name, value in saved.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))


def _quiet(conn: Conn) -> bool:
    """No other client transaction of the database is older than REBUILD_QUIET_SECONDS."""
    rows = fetch_all(conn, sql.query("old_transactions"), {"quiet": REBUILD_QUIET_SECONDS})
    return not rows[0]["old"]


def vacuum_bloated_table(conn: Conn) -> bool:
    """VACUUM rota.job when its file is far larger than its live rows need, as a long
    transaction leaves it: whether it did.

    Vacuum gives back the pages at a table's end once no row is left there.
    After a long transaction the table grew at its end, and the jobs written
    there last leave it only as the archive moves them: right after this run
    moved them, a vacuum can cut the end off, where autovacuum, coming when
    enough rows changed, may come while new rows still sit there. Under
    VACUUM_FACTOR the table is left to autovacuum. Skipped as the rebuild is:
    inside a transaction, while another transaction of the database is older
    than REBUILD_QUIET_SECONDS (vacuum could remove nothing it still sees), and
    (logged) when the role may not or the database refuses it in time.
    """
    if not conn.autocommit:
        return False
    try:
        with _maintenance_timeouts(conn):
            if not _quiet(conn):
                return False
            pages = fetch_all(conn, sql.query("job_pages"), {})[0]
            live = math.ceil(pages["live"])
            bloated = (
                pages["file"] > VACUUM_FACTOR * live and pages["file"] - live >= REBUILD_MIN_PAGES
            )
            if not (pages["owned"] and bloated):
                return False
            conn.execute("VACUUM rota.job")
            after = fetch_all(conn, sql.query("job_pages"), {})[0]["file"]
            log.info(
                "vacuumed rota.job: %d pages for rows that fill about %d; %d pages now",
                pages["file"], live, after,
            )  # fmt: skip
            return True
    except psycopg.errors.InsufficientPrivilege:
        log.info("the bloated rota.job not vacuumed: the role may not (it needs to own it)")
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
        log.warning("a vacuum of rota.job gave up, tried again next run: %s", exc)
    return False


def rebuild_bloated_indexes(conn: Conn) -> tuple[str, ...]:
    """Rebuild the bloated B-tree indexes of rota.job, one `REINDEX INDEX
    CONCURRENTLY` each (reads and writes go on; it scans the table twice), and
    drop what an interrupted rebuild left. Returns the names rebuilt.

    Skipped on a connection inside a transaction (REINDEX CONCURRENTLY cannot
    run there), while another transaction of the database is older than
    REBUILD_QUIET_SECONDS (the rebuild would wait for it and keep what it still
    sees), and, logged, when the role may not (the table's owner may; from
    PostgreSQL 17 a role with MAINTAIN on it) or the database refuses it in time.
    """
    if not conn.autocommit:
        return ()
    rebuilt: list[str] = []
    try:
        with _maintenance_timeouts(conn):
            for row in fetch_all(conn, sql.query("leftover_job_index_builds"), {}):
                conn.execute(
                    psycopg_sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS rota.{}").format(
                        psycopg_sql.Identifier(row["name"])
                    )
                )
                log.info("dropped %s, left by an interrupted index rebuild", row["name"])
            if not _quiet(conn):
                return ()
            bloated = fetch_all(
                conn,
                sql.query("bloated_job_indexes"),
                {
                    "factor": REBUILD_FACTOR,
                    "min_pages": REBUILD_MIN_PAGES,
                    "table_share": REBUILD_TABLE_SHARE,
                    "live_pages": fetch_all(conn, sql.query("job_pages"), {})[0]["live"],
                },
            )
            for row in bloated:
                conn.execute(
                    psycopg_sql.SQL("REINDEX INDEX CONCURRENTLY rota.{}").format(
                        psycopg_sql.Identifier(row["name"])
                    )
                )
                rebuilt.append(row["name"])
                log.info(
                    "rebuilt %s: %d pages for %d entries (about %d packed)",
                    row["name"], row["pages"], row["entries"], row["packed"],
                )  # fmt: skip
    except psycopg.errors.InsufficientPrivilege:
        log.info("bloated indexes of rota.job not rebuilt: the role may not (it needs to own it)")
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
        log.warning("an index rebuild of rota.job gave up, tried again next run: %s", exc)
    return tuple(rebuilt)


@handler(JOB_TYPE)
def archive_job(job: Job, ctx: Context) -> None:
    """The built-in schedule's job: archive with the settings in its payload."""
    try:
        settings = ArchiveSettings.from_payload(job.payload)
    except InvalidInput as exc:  # from_payload checks every value's type too
        raise Permanent(f"bad archive settings: {exc}") from None
    result = Archiver(settings).run_once(ctx.dsn)
    log.info("%s", result)
