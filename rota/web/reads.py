"""What the console's pages show, read from the database: typed rows, no HTML.

Every reader walks an index or a small side table (tests/web/test_plans.py
checks the plans over a million jobs). Nothing here writes.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from rota import archive, cron, durable, limits, schedule_store, sql, workers
from rota.db import Conn, fetch_all
from rota.errors import InvalidInput, JobNotFound
from rota.jobs import Job, Status
from rota.reading import RawInstant
from rota.web.filters import SCAN_ROWS, JobFilter


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
    effects_left_out: int = 0
    """Effect markers of the job's key past the SHOWN_ROWS listed."""


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
    effects = fetch_all(
        conn, sql.query("web_job_effects"), {"key": job.effect_key, "limit": SHOWN_ROWS}
    )
    effects_left_out = durable.left_out_of(effects)
    schedule = None
    if job.schedule_id is not None:
        found = fetch_all(conn, sql.query("web_schedule_by_id"), {"id": job.schedule_id})
        schedule = found[0] if found else None
    entries = row.get("errors")
    if entries is not None and not isinstance(entries, list):  # written around the checks
        entries = [_json_text(entries)]
    # The last ERRORS_KEPT, as the worker keeps them (more only written by hand).
    errors = [_attempt_error(e) for e in (entries or [])[-ERRORS_KEPT:]]
    return JobDetail(
        job, archived, effects, schedule, errors if "errors" in row else None,
        row.get("result"), "result" in row,
        job_trail(conn, job_id) if "parent_id" in row else None, effects_left_out,
    )  # fmt: skip


SHOWN_ROWS = 200
"""The most steps, waits, children or effect markers a job's page lists of each."""

ERRORS_KEPT = 20
"""The attempts' errors a job keeps (migration 0009), the most its page lists."""


def job_trail(conn: Conn, job_id: int) -> durable.Trail:
    """The step timeline of a durable job (templates/_job_trail.html shows it): at
    most SHOWN_ROWS of its steps, waits and children each."""
    return durable.trail(conn, job_id, SHOWN_ROWS)


def _attempt_error(entry: Any) -> dict[str, Any]:
    """One of `rota.job.errors`, its time read as an instant. What another shape
    holds (a time without an offset or outside 1970-9999, a number where an entry
    belongs) is shown as its text: `at` None, `at_text` the time's own text."""
    if not isinstance(entry, dict):
        return {"attempt": None, "at": None, "at_text": "", "error": _json_text(entry)}
    text = entry.get("at")
    try:
        at: datetime | None = limits.instant(datetime.fromisoformat(str(text)), "at")
    except (ValueError, InvalidInput):
        at = None
    return {
        "attempt": entry.get("attempt"), "at": at, "at_text": "" if text is None else str(text),
        "error": str(entry.get("error") or ""),
    }  # fmt: skip


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


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


def database_now(conn: Conn) -> datetime:
    """The database's clock: every time a page shows or counts from is measured by
    it (DESIGN.md section 1), not by the console host's, which may be off."""
    value: datetime = fetch_all(conn, sql.query("database_now"), {"now": None})[0]["now"]
    return value


def schedules(conn: Conn, now: datetime | None = None) -> list[ScheduleView]:
    """Each schedule with its next slots after `now` (None: the database's clock)."""
    tick = now or database_now(conn)
    views = []
    for row in schedule_store.list_all(conn):
        recent = fetch_all(
            conn, sql.query("web_schedule_recent_jobs"), {"id": row["id"], "limit": RECENT_JOBS}
        )
        views.append(dataclasses.replace(_schedule_view(row, tick), recent=recent))
    return views


def _schedule_view(row: dict[str, Any], now: datetime) -> ScheduleView:
    settings, refused = _archive_settings(row)
    if isinstance(row["next_run_at"], RawInstant):  # written around the checks (rota.reading)
        return ScheduleView(row, [], [], None, f"unreadable row: next_run_at {row['next_run_at']}")
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
    except OverflowError:  # a time written around the checks (rota.reading)
        return ScheduleView(row, [], [], None, f"unreadable row: next_run_at {row['next_run_at']}")
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
