"""What the console's pages show, read from the database: typed rows, no HTML.

Every reader walks an index or a small side table (tests/web/test_plans.py
checks the plans over a million jobs). Nothing here writes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

from rota import archive, cron, durable, schedule_store, sql, workers
from rota.db import Conn, fetch_all
from rota.errors import InvalidInput, JobNotFound
from rota.jobs import Job, Status
from rota.status import QueueStatus, read_status
from rota.web import charts
from rota.web.filters import SCAN_ROWS, JobFilter


@dataclasses.dataclass(frozen=True)
class Overview:
    status: QueueStatus
    paused: frozenset[str]
    throughput: charts.Chart
    queue_age: charts.Chart
    workers: int
    worker_types: tuple[tuple[str, ...], ...] = ()
    """The types each live worker lists (empty: every type it registers)."""

    def served_by(self, job_type: str) -> int:
        """Live workers that list this type."""
        return sum(1 for types in self.worker_types if job_type in types)

    @property
    def any_type_workers(self) -> int:
        """Live workers that list no types: they take every type they registered
        a handler for, which the database cannot tell."""
        return sum(1 for types in self.worker_types if not types)

    @property
    def warnings(self) -> list[tuple[str, str]]:
        """What an operator should look at first: (text, link)."""
        found = []
        for name, m in self.status.types.items():
            paused = self.all_paused or name in self.paused
            if m.due and not paused and not self.served_by(name) and not self.any_type_workers:
                found.append((
                    f"{m.due} due {name} job(s) and no live worker serves {name}",
                    f"/jobs?status=ready&type={quote(name)}",
                ))  # fmt: skip
        for limit in self.status.limits:
            if limit.limited:
                held = f"{limit.held} due {limit.type} job(s)"
                said = f"a limit holds back {held} ({limit.describe()})"
                found.append((said, "/types#limit-list"))
        if self.all_paused:
            found.append(("every type is paused", "/types"))
        elif self.paused:
            found.append((f"paused: {', '.join(sorted(self.paused))}", "/types"))
        expired = self.status.lease_expirations.current_hour
        if expired:
            found.append(
                (f"{expired} lease(s) expired this hour (workers died or stalled)", "/workers")
            )
        if self.missed_slots:
            found.append((f"{self.missed_slots} missed schedule slot(s)", "/schedules"))
        return found

    def held(self, job_type: str) -> int:
        """Due jobs of this type that its limits hold back now."""
        return sum(limit.held for limit in self.status.limits if limit.type == job_type)

    @property
    def all_paused(self) -> bool:
        return "*" in self.paused

    @property
    def type_names(self) -> list[str]:
        """Types with jobs, and types paused before any job of theirs arrived."""
        return sorted(set(self.status.types) | (self.paused - {"*"}))

    @property
    def missed_slots(self) -> int:
        return sum(s.missed_slots for s in self.status.schedules)


def _rates(rows: list[dict[str, Any]]) -> list[tuple[datetime, float]]:
    """Jobs finished per minute in each bucket, from the finished totals of it and
    the sampled bucket before (archiving lowers a total: never below zero)."""
    return [
        (
            s["at"],
            max(0.0, float(s["finished_total"] - p["finished_total"]))
            / max(1.0, (s["at"] - p["at"]).total_seconds() / 60),
        )
        for p, s in itertools.pairwise(rows)
    ]


Points = list[tuple[datetime, float]]


def _with_types(
    total: Points, by_type: dict[str, Points], weight: Callable[[Points], float]
) -> dict[str, Points]:
    """The total line ("all types"), then the lines of the types that weigh most
    (`weight` of a type's points; types that weigh nothing are left out)."""
    weights = {name: weight(points) for name, points in by_type.items()}
    heaviest = sorted((name for name, w in weights.items() if w > 0), key=lambda n: -weights[n])
    return {"all types": total} | {name: by_type[name] for name in heaviest[: charts.MAX_LINES - 1]}


def _ages(rows: list[dict[str, Any]], since: datetime) -> Points:
    """The oldest ready ages of the samples after `since` (the bucket before the
    range is there for the rates only); samples without one are gaps."""
    return [
        (r["at"], float(r["oldest_ready_age_seconds"]))
        for r in rows
        if r["at"] > since and r["oldest_ready_age_seconds"] is not None
    ]


def _charts(
    conn: Conn, samples: list[dict[str, Any]], params: dict[str, Any], since: datetime
) -> tuple[dict[str, Points], dict[str, Points]]:
    """The throughput lines (the busiest types) and the queue-age lines (the types
    whose jobs waited longest), from the queue's and the per-type samples."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for row in fetch_all(conn, sql.query("web_chart_type_samples"), params):
        by_type.setdefault(row["type"], []).append(row)
    rates = {name: _rates(rows) for name, rows in by_type.items()}
    ages = {name: _ages(rows, since) for name, rows in by_type.items()}
    return (
        _with_types(_rates(samples), rates, lambda points: sum(v for _, v in points)),
        _with_types(
            _ages(samples, since), ages, lambda points: max((v for _, v in points), default=0)
        ),
    )


def overview(
    conn: Conn, now: datetime | None = None, span: str = "1h", drawn: bool = True
) -> Overview:
    """The queue now and, when `drawn`, its charts over `span` (a key of charts.RANGES)."""
    status = read_status(conn, now=now)
    paused = frozenset(r["type"] for r in fetch_all(conn, sql.query("web_paused_types")))
    chosen = charts.RANGES[span]
    params = {"now": now, "span": chosen.span, "bucket": chosen.bucket}
    samples = fetch_all(conn, sql.query("web_chart_samples"), params) if drawn else []
    end = status.now
    since = end - chosen.span - chosen.bucket
    throughput, ages = _charts(conn, samples, params, since) if drawn else ({}, {})
    worker_types = tuple(
        tuple(r["types"] or ())
        for r in fetch_all(conn, sql.query("web_live_worker_types"), {"now": now})
    )
    return Overview(
        status=status,
        paused=paused,
        throughput=charts.chart("Jobs finished per minute", throughput, end, chosen),
        queue_age=charts.chart("Oldest ready job's age, seconds", ages, end, chosen),
        workers=status.workers,
        worker_types=worker_types,
    )


@dataclasses.dataclass(frozen=True)
class JobPage:
    rows: list[dict[str, Any]]
    next_before: int | None
    """Cursor of the next (older) page; None at the end."""
    scanned: int
    """Rows of the window examined (filters on type, payload or time)."""
    window_full: bool
    """The window was used up before the page filled: older matches may exist."""


def job_page(conn: Conn, found: JobFilter, before: int | None, limit: int) -> JobPage:
    bounded = found.bounded
    scan = SCAN_ROWS if bounded else limit + 1
    sorted_ = found.status is not None and found.status != Status.DONE
    params = {
        **found.params(), "before": before, "bounded": bounded, "scan": scan, "sorted": sorted_,
    }  # fmt: skip
    rows = fetch_all(conn, sql.query("web_jobs_page"), {**params, "limit": limit + 1})
    if rows:
        scanned, scanned_to = int(rows[0]["scanned"]), rows[0]["scanned_to"]
    else:
        window = fetch_all(conn, sql.query("web_jobs_window"), params)[0]
        scanned, scanned_to = int(window["scanned"]), window["scanned_to"]
    window_full = bounded and scanned >= scan
    if len(rows) > limit:
        rows = rows[:limit]
        next_before: int | None = rows[-1]["id"]
    elif window_full:
        next_before = scanned_to
    else:
        next_before = None
    return JobPage(rows, next_before, scanned, window_full and len(rows) < limit)


@dataclasses.dataclass(frozen=True)
class JobDetail:
    job: Job
    archived: bool
    effects: list[dict[str, Any]]
    schedule: dict[str, Any] | None
    errors: list[dict[str, Any]] | None = None
    """Every attempt's error, oldest first ({attempt, at, error}); None when the
    database has no errors column (before migration 0009)."""
    result: Any = None
    has_results: bool = False
    """The database keeps results (migration 0009): `result` is the job's value."""
    trail: durable.Trail | None = None
    """A durable job's steps, waits, children and parent (see `job_trail`)."""


def job_detail(conn: Conn, job_id: int) -> JobDetail:
    rows = fetch_all(conn, sql.query("get_job"), {"id": job_id})
    archived = False
    if not rows:
        rows = fetch_all(conn, sql.query("web_archived_job"), {"id": job_id})
        archived = True
    if not rows:
        raise JobNotFound(f"no job with id {job_id}")
    row = rows[0]
    job = Job.from_row(row)
    effects = fetch_all(conn, sql.query("web_job_effects"), {"key": job.effect_key})
    schedule = None
    if job.schedule_id is not None:
        found = fetch_all(conn, sql.query("web_schedule_by_id"), {"id": job.schedule_id})
        schedule = found[0] if found else None
    errors = [_attempt_error(e) for e in row.get("errors") or [] if isinstance(e, dict)]
    return JobDetail(
        job, archived, effects, schedule, errors if "errors" in row else None,
        row.get("result"), "result" in row,
        job_trail(conn, job_id) if "parent_id" in row else None,
    )  # fmt: skip


def job_trail(conn: Conn, job_id: int) -> durable.Trail:
    """The step timeline of a durable job (templates/_job_trail.html shows it)."""
    return durable.trail(conn, job_id)


def _attempt_error(entry: dict[str, Any]) -> dict[str, Any]:
    """One of `rota.job.errors`, its time read as an instant (None when unreadable)."""
    try:
        at = datetime.fromisoformat(str(entry.get("at")))
    except ValueError:
        at = None
    return {"attempt": entry.get("attempt"), "at": at, "error": str(entry.get("error") or "")}


def known_types(conn: Conn) -> list[str]:
    """Job types to offer in the type filter (from small tables only)."""
    return [r["type"] for r in fetch_all(conn, sql.query("web_known_types"))]


def dead_groups(conn: Conn, limit: int = 200) -> list[dict[str, Any]]:
    return fetch_all(conn, sql.query("web_dead_groups"), {"limit": limit})


def audit_page(
    conn: Conn, before: int | None, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    rows = fetch_all(conn, sql.query("web_audit_page"), {"before": before, "limit": limit + 1})
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1]["id"]
    return rows, None


def live_workers(conn: Conn) -> list[workers.LiveWorker]:
    return workers.live(conn)


@dataclasses.dataclass(frozen=True)
class ScheduleView:
    row: dict[str, Any]
    next_slots: list[datetime]
    """The next slots in the schedule's own zone (each also shown in UTC)."""
    dst_preview: list[datetime]
    """Slots around the zone's next change of UTC offset (empty: no change within a year)."""
    dst_change: datetime | None
    error: str = ""
    archive: archive.ArchiveSettings | None = None
    """The archiver's settings, read from its payload (the built-in rota/archive schedule)."""
    recent: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Its latest jobs, newest slot first."""

    @property
    def zone(self) -> ZoneInfo | None:
        try:
            return cron.zone(self.row["timezone"])
        except InvalidInput:
            return None


RECENT_JOBS = 5


def schedules(conn: Conn, now: datetime | None = None) -> list[ScheduleView]:
    tick = now or datetime.now(UTC)
    views = []
    for row in schedule_store.list_all(conn):
        recent = fetch_all(
            conn, sql.query("web_schedule_recent_jobs"), {"id": row["id"], "limit": RECENT_JOBS}
        )
        views.append(dataclasses.replace(_schedule_view(row, tick), recent=recent))
    return views


def _schedule_view(row: dict[str, Any], now: datetime) -> ScheduleView:
    settings, refused = _archive_settings(row)
    try:
        start = max(now, row["next_run_at"] - timedelta(microseconds=1))
        slots = cron.preview(row["cron"], row["timezone"], start=start, count=5)
        change = next_offset_change(row["timezone"], now)
        dst = (
            cron.preview(row["cron"], row["timezone"], start=change - timedelta(hours=3), count=6)
            if change
            else []
        )
    except InvalidInput as exc:
        return ScheduleView(row, [], [], None, str(exc))
    return ScheduleView(row, slots, dst, change, refused, settings)


def _archive_settings(row: dict[str, Any]) -> tuple[archive.ArchiveSettings | None, str]:
    """The archiver's settings from its schedule's payload, or why its runs would refuse it."""
    if row["job_type"] != archive.JOB_TYPE:
        return None, ""
    try:
        return archive.ArchiveSettings.from_payload(row["payload"]), ""
    except InvalidInput as exc:
        return None, f"the archiver refuses this payload: {exc}"


def span(seconds: float | None) -> str:
    """A duration as `rota archive` takes it: 7d, 36h, 90m, 45s (the largest whole unit)."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


def next_offset_change(zone_name: str, after: datetime, days: int = 400) -> datetime | None:
    """The first instant after `after` when the zone's UTC offset changes (hour precision)."""
    zone = cron.zone(zone_name)
    current = after.astimezone(zone).utcoffset()
    step = after.replace(minute=0, second=0, microsecond=0)
    for day in range(days):
        probe = step + timedelta(days=day + 1)
        if probe.astimezone(zone).utcoffset() != current:
            for hour in range(24, -1, -1):
                earlier = probe - timedelta(hours=hour)
                if earlier > after and earlier.astimezone(zone).utcoffset() != current:
                    return earlier
    return None
