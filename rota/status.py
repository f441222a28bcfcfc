"""How the queue is doing: typed measures per job type, and what deserves attention.

`read_status` is the one reader of the database measures: `rota status`, the
demo and the Prometheus collector all show what it returns, so what a person
reads in a terminal and what an alert fires on never disagree. Its queries read
partial indexes and small side tables, never every row of ``rota.job``.
This module only reads; it never changes a row.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from rota import limits, sql
from rota.db import ConnOrDsn, connection, fetch_all
from rota.flow import Limit, list_limits
from rota.jobs import Status
from rota.reading import shown


@dataclasses.dataclass(frozen=True, slots=True)
class TypeStatus:
    """The measures of one job type."""

    ready: int = 0
    """Jobs waiting to run, due or not."""
    due: int = 0
    """Ready jobs whose run_at has come."""
    oldest_ready_age_seconds: float = 0.0
    """Seconds the oldest due job has waited past its run_at (0 if none)."""
    running: int = 0
    waiting: int = 0
    """Jobs suspended by their handler (a sleep, an event, children): no worker
    holds them, and they are not ready until their wait is over."""
    done: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    paused: bool = False
    """No worker claims jobs of this type (paused by type, or every type paused)."""
    held: int = 0
    """Due jobs a limit of the type holds back now (rota.flow)."""

    @property
    def limited(self) -> bool:
        """A limit holds some of this type's due jobs back."""
        return self.held > 0

    def count(self, status: Status) -> int:
        value: int = getattr(self, status.value)
        return value


@dataclasses.dataclass(frozen=True, slots=True)
class HourCount:
    hour: datetime
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseExpirations:
    """Leases the reaper found expired, counted per UTC hour."""

    total: int
    current_hour: int
    previous_hour: int
    last_24h: int
    by_hour: tuple[HourCount, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleStatus:
    name: str
    job_type: str
    suspend: bool
    missed_slots: int
    skipped_slots: int
    next_run_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStatus:
    """Everything `rota status` shows, read at one instant of the database clock."""

    now: datetime
    types: dict[str, TypeStatus]
    lease_expirations: LeaseExpirations
    schedules: tuple[ScheduleStatus, ...] = ()
    paused: tuple[str, ...] = ()
    """Paused job types; "*" means every type is paused."""
    workers: int = 0
    """Live workers: registered in rota.worker, their rows not expired."""
    limits: tuple[Limit, ...] = ()
    """Every type's limits, with what each holds back (`rota limit list`)."""

    @property
    def dead_jobs(self) -> int:
        return sum(t.dead for t in self.types.values())

    def to_json(self) -> dict[str, Any]:
        """Plain data, as `rota status --json` prints it (instants as ISO-8601)."""
        data = _plain(dataclasses.asdict(self))
        data["dead_jobs"] = self.dead_jobs
        for job_type, measures in self.types.items():
            data["types"][job_type]["limited"] = measures.limited
        data["limits"] = [limit.to_json() for limit in self.limits]
        return data


@dataclasses.dataclass(frozen=True, slots=True)
class QueueAge:
    """How far behind the queue is for some job types (the autoscaler's input)."""

    oldest_ready_age_seconds: float
    """Seconds since the oldest job that could run now became runnable (0 if none)."""
    ready_jobs: int
    """Jobs that could run now (status ready, run_at <= now)."""
    running_jobs: int = 0
    """Jobs being run now (status running)."""
    paused_types: tuple[str, ...] = ()
    """Which of the types asked about are paused ("*": every type); their jobs
    are not counted as waiting."""
    limited_types: tuple[str, ...] = ()
    """Which of the types asked about have due jobs a limit holds back; their
    jobs are not counted as waiting either (more workers would not start them)."""


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def read_status(conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> QueueStatus:
    """The database measures; `now` freezes the clock for tests (default: the database's)."""
    params = {"now": limits.clock(now)}
    with connection(conn_or_dsn) as conn:
        counts = fetch_all(conn, sql.query("metrics_job_counts"), params)
        leases = fetch_all(conn, sql.query("metrics_lease_expirations"), params)[0]
        by_hour = fetch_all(conn, sql.query("metrics_lease_expirations_by_hour"), params)
        schedules = fetch_all(conn, sql.query("metrics_schedules"), params)
        paused = tuple(r["type"] for r in fetch_all(conn, sql.query("paused_types")))
        workers = fetch_all(conn, sql.query("worker_live_count"), params)[0]["workers"]
        held = tuple(list_limits(conn, now))
    return QueueStatus(
        now=leases["now"],
        types=_types(counts, paused, held),
        lease_expirations=LeaseExpirations(
            total=int(leases["total"]),
            current_hour=int(leases["current_hour"]),
            previous_hour=int(leases["previous_hour"]),
            last_24h=int(leases["last_24h"]),
            by_hour=tuple(HourCount(r["hour"], int(r["count"])) for r in by_hour),
        ),
        schedules=tuple(ScheduleStatus(**row) for row in schedules),
        paused=paused,
        workers=int(workers),
        limits=held,
    )


def age(seconds: Any) -> float:
    """An age in seconds as the database computed it, never negative and always
    finite: a ready job at `-infinity` (a row written around Rota's checks, see
    rota.reading) reads as one due since 1970-01-01, the earliest time Rota takes."""
    value = float(seconds)
    if not math.isfinite(value):
        return (datetime.now(UTC) - limits.MIN_INSTANT).total_seconds()
    return max(value, 0.0)


def _types(
    rows: Iterable[dict[str, Any]], paused: Sequence[str], limits: Sequence[Limit] = ()
) -> dict[str, TypeStatus]:
    measures: dict[str, dict[str, Any]] = {t: {} for t in paused if t != "*"}
    for limit in limits:
        measures.setdefault(limit.type, {})["held"] = limit.held
    for row in rows:
        fields = measures.setdefault(row["type"], {})
        fields[row["status"]] = int(row["jobs"])
        if row["status"] == Status.READY:
            fields["due"] = int(row["due"])
            fields["oldest_ready_age_seconds"] = age(row["oldest_ready_age_seconds"])
    every = "*" in paused
    return {
        t: TypeStatus(**fields, paused=every or t in paused)
        for t, fields in sorted(measures.items())
    }


def queue_age(
    conn_or_dsn: ConnOrDsn, types: Sequence[str] | None = None, now: datetime | None = None
) -> QueueAge:
    """Age of the oldest due job of `types` (or any), with ready and running counts."""
    wanted = list(types) if types is not None else None
    with connection(conn_or_dsn) as conn:
        held = [limit.type for limit in list_limits(conn, now, wanted) if limit.limited]
        params = {"types": wanted, "held": held, "now": now}
        row = fetch_all(conn, sql.query("queue_age"), params)[0]
        paused = fetch_all(conn, sql.query("paused_among"), params)
    return QueueAge(
        age(row["oldest_ready_age_seconds"]),
        int(row["ready_jobs"]),
        int(row["running_jobs"]),
        tuple(r["type"] for r in paused),
        tuple(held),
    )


# -- what deserves attention, and how it reads in a terminal -------------------------


def warnings(status: QueueStatus, max_age_seconds: float, max_lease_expirations: int) -> list[str]:
    """What deserves a person's attention in these measures, one sentence each."""
    found = []
    for job_type, measures in status.types.items():
        age = measures.oldest_ready_age_seconds
        if age > max_age_seconds:
            found.append(
                f"{job_type}: the oldest ready job has waited {format_age(age)}"
                f" (more than {format_age(max_age_seconds)}): too few workers?"
            )
    leases = status.lease_expirations
    worst = max(leases.current_hour, leases.previous_hour)
    if worst >= max_lease_expirations:
        found.append(
            f"{worst} leases expired within one hour (threshold {max_lease_expirations}):"
            " workers are dying or handlers outlive their lease"
        )
    if status.dead_jobs:
        found.append(
            f"{status.dead_jobs} dead job(s): `rota dead list` shows them,"
            " `rota dead retry` runs them again"
        )
    return found


def format_age(seconds: float) -> str:
    """1h02m, 4m05s, 12s: short enough for a table column."""
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{seconds:.0f}s"


_COLUMNS = ("TYPE", "READY", "DUE", "OLDEST READY", "RUNNING", "WAITING", "DONE", "FAILED",
            "DEAD", "CANCELLED", "STATE")  # fmt: skip


def _table(rows: list[tuple[str, ...]]) -> str:
    """Aligned columns, the first to the left; each cell `shown` (a name's control
    characters escaped: no value moves the cursor or breaks a line)."""
    rows = [tuple(shown(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "".join(line.rstrip() + "\n" for line in lines)


def _type_rows(status: QueueStatus) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for job_type, m in status.types.items():
        rows.append(
            (
                job_type,
                str(m.ready),
                str(m.due),
                format_age(m.oldest_ready_age_seconds) if m.due else "-",
                str(m.running),
                str(m.waiting),
                str(m.done),
                str(m.failed),
                str(m.dead),
                str(m.cancelled),
                "PAUSED" if m.paused else "LIMITED" if m.limited else "active",
            )
        )
    return rows


def _limit_rows(status: QueueStatus) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("LIMITED TYPE", "LIMITS", "RUNNING", "HELD BACK")]
    for limit in status.limits:
        rows.append((limit.type, limit.describe(), str(limit.running), str(limit.held)))
    return rows


def _schedule_rows(status: QueueStatus) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("SCHEDULE", "TYPE", "MISSED", "SKIPPED", "NEXT RUN")]
    for s in status.schedules:
        next_run = "suspended" if s.suspend else s.next_run_at.isoformat(timespec="seconds")
        rows.append((s.name, s.job_type, str(s.missed_slots), str(s.skipped_slots), next_run))
    return rows


def render(status: QueueStatus, found: Sequence[str] = (), keys: str | None = None) -> str:
    """The status as text: a table per type, lease expirations, schedules, warnings;
    with `keys`, how idempotency keys are kept unique (rota.migrate.describe_key_index)."""
    parts = [f"Rota status at {status.now.isoformat()}\n\n"]
    parts.append(_table(_type_rows(status)) if status.types else "No jobs.\n")
    leases = status.lease_expirations
    parts.append(
        f"\nLease expirations: {leases.current_hour} this hour, "
        f"{leases.previous_hour} the hour before, {leases.last_24h} in 24 h, "
        f"{leases.total} in all\n"
    )
    parts.append(f"Workers alive: {status.workers}\n")
    if keys is not None:
        parts.append(f"Idempotency keys: {keys}\n")
    if "*" in status.paused:
        parts.append("\nEvery job type is PAUSED (rota resume --all lifts it)\n")
    if status.limits:
        parts.append("\n" + _table(_limit_rows(status)))
    if status.schedules:
        parts.append("\n" + _table(_schedule_rows(status)))
    parts.append(
        "\nWarnings:\n" + "".join(f"  ! {shown(w)}\n" for w in found)
        if found
        else "\nNo warnings.\n"
    )
    return "".join(parts)
