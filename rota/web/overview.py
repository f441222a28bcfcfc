"""What the overview shows, read from the database: the queue by type, what
needs the operator (named by type, with counts), and the charts.

"Ready" means one thing here, as in `rota status` and the queue samples the
charts read: a ready job whose run_at has come (due). A ready job not yet due
(delayed, or waiting for its next attempt) is counted apart, so the table's
ready jobs and the "oldest ready job" chart always speak of the same jobs.
Every reader walks a partial index or a small side table. Nothing here writes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from rota import sql
from rota.db import Conn, fetch_all
from rota.status import QueueStatus, read_status
from rota.web import charts

FAILING_MINUTES = 10
"""The overview names the types whose attempts failed within this many minutes."""

Points = list[tuple[datetime, float]]
Warning = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Retrying:
    """A type's ready jobs waiting for another attempt after a failed one."""

    jobs: int
    attempts: int
    """The attempts made by the one furthest along..."""
    max_attempts: int
    """...and how many it may make."""


@dataclasses.dataclass(frozen=True)
class Overview:
    status: QueueStatus
    paused: frozenset[str]
    throughput: charts.Chart
    queue_age: charts.Chart
    workers: int
    worker_types: tuple[tuple[str, ...], ...] = ()
    """The types each live worker lists (empty: every type it registers)."""
    failures: charts.Chart | None = None
    retrying: dict[str, Retrying] = dataclasses.field(default_factory=dict)
    failing: dict[str, int] = dataclasses.field(default_factory=dict)
    """Attempts failed per type in the last FAILING_MINUTES minutes."""

    def served_by(self, job_type: str) -> int:
        """Live workers that list this type."""
        return sum(1 for types in self.worker_types if job_type in types)

    @property
    def any_type_workers(self) -> int:
        """Live workers that list no types: they take every type they registered
        a handler for, which the database cannot tell."""
        return sum(1 for types in self.worker_types if not types)

    @property
    def warnings(self) -> list[Warning]:
        """What an operator should look at first: (text, link); jobs in trouble
        first, by type with their counts."""
        return [*self.troubles, *self._stalls()]

    @property
    def troubles(self) -> list[Warning]:
        """Dead, failed, retrying and failing work, by type."""
        found = []
        for name, m in self.status.types.items():
            q = quote(name)
            if m.dead:
                found.append((f"{m.dead} dead {name} job(s)", f"/jobs?status=dead&type={q}"))
            if m.failed:
                text = f"{m.failed} failed {name} job(s) (a permanent error)"
                found.append((text, f"/jobs?status=failed&type={q}"))
            if name in self.retrying:
                r = self.retrying[name]
                text = (
                    f"{r.jobs} {name} job(s) retrying after an error"
                    f" (furthest: {r.attempts} of {r.max_attempts} attempts)"
                )
                found.append((text, f"/jobs?status=retrying&type={q}"))
        for name, count in sorted(self.failing.items()):
            text = f"{count} {name} attempt(s) failed in the last {FAILING_MINUTES} minutes"
            found.append((text, f"/jobs?type={quote(name)}"))
        return found

    def _stalls(self) -> list[Warning]:
        """Work that cannot go on: no worker, a limit, a pause, dying workers, missed slots."""
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
                found.append(
                    (f"a limit holds back {held} ({limit.describe()})", "/types#limit-list")
                )
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

    def retrying_jobs(self, job_type: str) -> int:
        found = self.retrying.get(job_type)
        return found.jobs if found else 0

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


def read(conn: Conn, now: datetime | None = None, span: str = "1h", drawn: bool = True) -> Overview:
    """The queue now and, when `drawn`, its charts over `span` (a key of charts.RANGES)."""
    status = read_status(conn, now=now)
    paused = frozenset(r["type"] for r in fetch_all(conn, sql.query("web_paused_types")))
    worker_types = tuple(
        tuple(r["types"] or ())
        for r in fetch_all(conn, sql.query("web_live_worker_types"), {"now": now})
    )
    retrying = {
        r["type"]: Retrying(int(r["jobs"]), int(r["attempts"]), int(r["max_attempts"]))
        for r in fetch_all(conn, sql.query("web_retrying_types"))
    }
    since = status.now - timedelta(minutes=FAILING_MINUTES)
    failing = {
        r["type"]: int(r["failures"])
        for r in fetch_all(conn, sql.query("web_failing_types"), {"since": since})
    }
    drawings = _drawn(conn, now, status.now, charts.RANGES[span]) if drawn else {}
    empty = charts.chart("", {}, status.now, charts.RANGES[span])
    return Overview(
        status=status,
        paused=paused,
        throughput=drawings.get("throughput", empty),
        queue_age=drawings.get("queue_age", empty),
        workers=status.workers,
        worker_types=worker_types,
        failures=drawings.get("failures"),
        retrying=retrying,
        failing=failing,
    )


def _drawn(
    conn: Conn, now: datetime | None, end: datetime, chosen: charts.Range
) -> dict[str, charts.Chart]:
    """The three charts of the overview over `chosen`, ending at `end`."""
    params = {"now": now, "span": chosen.span, "bucket": chosen.bucket}
    samples = fetch_all(conn, sql.query("web_chart_samples"), params)
    since = end - chosen.span - chosen.bucket
    by_type: dict[str, list[dict[str, Any]]] = {}
    for row in fetch_all(conn, sql.query("web_chart_type_samples"), params):
        by_type.setdefault(row["type"], []).append(row)
    rates = {name: _rates(rows) for name, rows in by_type.items()}
    ages = {name: _ages(rows, since) for name, rows in by_type.items()}
    total = lambda points: sum(v for _, v in points)  # noqa: E731
    worst = lambda points: max((v for _, v in points), default=0)  # noqa: E731
    throughput = _with_types(_rates(samples), rates, total)
    queue_age = _with_types(_ages(samples, since), ages, worst)
    failures = _failures(conn, params, end, chosen)
    return {
        "throughput": charts.chart("Jobs finished per minute", throughput, end, chosen),
        "queue_age": charts.chart("Oldest ready job's age, seconds", queue_age, end, chosen),
        "failures": charts.chart("Failed attempts per minute", failures, end, chosen),
    }


def _failures(
    conn: Conn, params: dict[str, Any], end: datetime, chosen: charts.Range
) -> dict[str, Points]:
    """Failed attempts per minute in every bucket of the range (zero where none
    failed), in all and for the types that failed most."""
    rows = fetch_all(conn, sql.query("web_chart_failures"), params)
    minutes = chosen.bucket.total_seconds() / 60
    buckets = _buckets(end, chosen)
    counts: dict[str, dict[datetime, float]] = {}
    for row in rows:
        counts.setdefault(row["type"], {})[row["at"]] = float(row["failures"]) / minutes
    by_type = {name: [(at, per.get(at, 0.0)) for at in buckets] for name, per in counts.items()}
    every = [(at, sum(per.get(at, 0.0) for per in counts.values())) for at in buckets]
    return _with_types(every, by_type, lambda points: sum(v for _, v in points))


def _buckets(end: datetime, chosen: charts.Range) -> list[datetime]:
    """The starts of the buckets of the range, as the samples' bins (from 2000-01-01)."""
    origin = datetime(2000, 1, 1, tzinfo=end.tzinfo)
    size = chosen.bucket
    last = origin + ((end - origin) // size) * size
    count = int(chosen.span / size)
    return [last - size * k for k in range(count, -1, -1)]


def _rates(rows: list[dict[str, Any]]) -> Points:
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
