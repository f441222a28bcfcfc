"""The queue's measures, for Prometheus and for `rota status`.

Two kinds of measure live here. The database measures (queue depth, the age of
the oldest ready job, dead letters, lease expirations, missed schedule slots)
are read by `read_status` with queries that touch only partial indexes and small
side tables, never every row of ``rota.job``; `DatabaseCollector` serves them,
cached for a few seconds so any number of scrapers costs one round of queries.
The in-process measures (finished jobs by outcome, durations, attempts) are
counted by the worker through `record_finish`.

This module never decides anything from what it measures: it only reports.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rota import sql
from rota.db import Conn, ConnOrDsn, connect, connection, fetch_all, is_unavailable
from rota.errors import RotaError

log = logging.getLogger(__name__)

STATUSES = ("ready", "running", "done", "failed", "dead")
OUTCOMES = ("done", "retry", "failed", "dead", "released", "lease_lost")
"""What a worker can report when it lets go of a job (see `record_finish`)."""
FINAL_OUTCOMES = frozenset({"done", "failed", "dead"})
"""Outcomes that end a job's life: only these feed the attempts histogram."""

_FINISHED = Counter(
    "rota_jobs_finished",
    "Jobs a worker let go of, by type and outcome (done, retry, failed, dead, released, "
    "lease_lost).",
    ["type", "outcome"],
    registry=None,
)
_DURATION = Histogram(
    "rota_job_duration_seconds",
    "How long a handler ran, whatever its outcome, in seconds.",
    ["type"],
    buckets=(
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
        60,
        120,
        300,
        600,
        1800,
        3600,
    ),
    registry=None,
)
_ATTEMPTS = Histogram(
    "rota_job_attempts",
    "Attempts a job had used when it ended (done, failed or dead).",
    buckets=(1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 100),
    registry=None,
)


def record_finish(job_type: str, outcome: str, duration_seconds: float, attempts: int) -> None:
    """Count one handler run that ended with `outcome`; called by the worker."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
    _FINISHED.labels(type=job_type, outcome=outcome).inc()
    _DURATION.labels(type=job_type).observe(max(0.0, duration_seconds))
    if outcome in FINAL_OUTCOMES:
        _ATTEMPTS.observe(attempts)


# -- reading the database ----------------------------------------------------------


def _empty_type() -> dict[str, Any]:
    return {
        "ready": 0,
        "due": 0,
        "oldest_ready_age_seconds": 0.0,
        "running": 0,
        "done": 0,
        "failed": 0,
        "dead": 0,
    }


def _types(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    types: dict[str, dict[str, Any]] = {}
    for row in rows:
        measures = types.setdefault(row["type"], _empty_type())
        measures[row["status"]] = int(row["jobs"])
        if row["status"] == "ready":
            measures["due"] = int(row["due"])
            measures["oldest_ready_age_seconds"] = max(0.0, float(row["oldest_ready_age_seconds"]))
    return dict(sorted(types.items()))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def read_status(conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> dict[str, Any]:
    """The database measures as plain data (what `rota status --json` prints).

    `now` freezes the clock for tests; by default the database's clock is used.
    """
    params = {"now": now}
    with connection(conn_or_dsn) as conn:
        counts = fetch_all(conn, sql.query("metrics_job_counts"), params)
        leases = fetch_all(conn, sql.query("metrics_lease_expirations"), params)[0]
        by_hour = fetch_all(conn, sql.query("metrics_lease_expirations_by_hour"), params)
        schedules = fetch_all(conn, sql.query("metrics_schedules"), params)
    types = _types(counts)
    return {
        "now": _iso(leases["now"]),
        "types": types,
        "dead_jobs": sum(t["dead"] for t in types.values()),
        "lease_expirations": {
            "total": int(leases["total"]),
            "current_hour": int(leases["current_hour"]),
            "previous_hour": int(leases["previous_hour"]),
            "last_24h": int(leases["last_24h"]),
            "by_hour": [{"hour": _iso(r["hour"]), "count": int(r["count"])} for r in by_hour],
        },
        "schedules": [
            {
                **row,
                "next_run_at": _iso(row["next_run_at"]),
                "missed_slots": int(row["missed_slots"]),
                "skipped_slots": int(row["skipped_slots"]),
            }
            for row in schedules
        ],
    }


# -- serving it to Prometheus --------------------------------------------------------


def _families(status: dict[str, Any] | None) -> list[Metric]:
    """The database measures as metric families (empty families without `status`)."""
    age = GaugeMetricFamily(
        "rota_oldest_ready_job_age_seconds",
        "Seconds the oldest ready job with run_at <= now has waited past its run_at (0 if none).",
        labels=["type"],
    )
    jobs = GaugeMetricFamily(
        "rota_jobs", "Jobs in rota.job by status and type.", labels=["status", "type"]
    )
    running = GaugeMetricFamily(
        "rota_running_jobs", "Jobs running now (lease held), by type.", labels=["type"]
    )
    dead = GaugeMetricFamily("rota_dead_jobs", "Jobs in the dead-letter list (status dead).")
    expired = CounterMetricFamily(
        "rota_lease_expirations", "Leases the reaper found expired (worker gone), ever."
    )
    missed = CounterMetricFamily(
        "rota_schedule_missed_slots",
        "Slots a schedule missed while no scheduler ran.",
        labels=["schedule"],
    )
    if status is not None:
        for job_type, measures in status["types"].items():
            age.add_metric([job_type], measures["oldest_ready_age_seconds"])
            running.add_metric([job_type], measures["running"])
            for name in STATUSES:
                jobs.add_metric([name, job_type], measures[name])
        dead.add_metric([], status["dead_jobs"])
        expired.add_metric([], status["lease_expirations"]["total"])
        for schedule in status["schedules"]:
            missed.add_metric([schedule["name"]], schedule["missed_slots"])
    return [age, jobs, running, dead, expired, missed]


class DatabaseCollector:
    """Serves `read_status` as metrics, reading the database at most once per interval.

    Scrapes that arrive within `cache_seconds` of the last read share its result,
    so many Prometheus servers (or many pods each serving these measures) cost
    the database one round of cheap queries per interval. A failed read is also
    remembered for the interval; while the database is unreachable the database
    measures are simply absent, never stale.
    """

    def __init__(
        self, dsn: str, *, cache_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.dsn = dsn
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: Conn | None = None
        self._status: dict[str, Any] | None = None
        self._read_at = -math.inf
        self.reads = 0
        """How many times the database was read (for tests and debugging)."""

    def describe(self) -> list[Metric]:
        return _families(None)

    def collect(self) -> Iterator[Metric]:
        yield from _families(self.status())

    def status(self) -> dict[str, Any] | None:
        """The latest measures, read again when the cached ones are too old."""
        with self._lock:
            if self._clock() - self._read_at >= self.cache_seconds:
                self._status = self._read()
                self._read_at = self._clock()
            return self._status

    def _read(self) -> dict[str, Any] | None:
        self.reads += 1
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.dsn, application_name="rota-metrics")
            return read_status(self._conn)
        except RotaError as exc:
            log.warning("metrics: cannot read the database: %s", exc)
            if is_unavailable(exc):
                self.close_connection()
            return None

    def close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def metric_types() -> dict[str, str]:
    """Every metric `build_registry` serves, family name -> Prometheus type (for tests, docs)."""
    found = {family.name: family.type for family in _families(None)}
    for metric in (_FINISHED, _DURATION, _ATTEMPTS):
        found.update((family.name, family.type) for family in metric.describe())
    return found


def build_registry(dsn: str, *, cache_seconds: float = 5.0) -> CollectorRegistry:
    """A registry with the database measures and this process's job counters."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(dsn, cache_seconds=cache_seconds))
    for metric in (_FINISHED, _DURATION, _ATTEMPTS):
        registry.register(metric)
    return registry
