"""The queue's measures, for Prometheus and for `rota status`.

Two kinds of measure live here. The database measures (queue depth, the age of
the oldest ready job, dead letters, lease expirations, missed schedule slots)
are read by `read_status` with queries that touch only partial indexes and small
side tables, never every row of ``rota.job``; `DatabaseCollector` serves them,
cached for a few seconds so any number of scrapers costs one round of queries.
The in-process measures (finished jobs by outcome, durations, attempts) are
counted by the worker through `record_outcome`.

This module never decides anything from what it measures: it only reports.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from rota.db import Conn, connect, is_unavailable
from rota.errors import RotaError
from rota.jobs import Outcome, Status
from rota.status import QueueStatus, read_status

log = logging.getLogger(__name__)

FINAL_OUTCOMES = frozenset({Outcome.DONE, Outcome.FAILED, Outcome.DEAD, Outcome.CANCELLED})
"""Outcomes that end a job's life: only these feed the attempts histogram."""

DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
)  # fmt: skip
"""Upper bounds of `rota_job_duration_seconds`, in seconds."""

ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 100)
"""Upper bounds of `rota_job_attempts`."""

_KNOWN_OUTCOMES = frozenset(Outcome)


class _Buckets:
    """One histogram series: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def cumulative(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        running = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*map(floatToGoString, bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class RunCounter:
    """The worker's own measures: finished jobs by outcome, durations, attempts.

    Counted a batch at a time under one lock: prometheus_client's metric objects
    take a lock per value they change (the sum and a bucket of each histogram, for
    every job): 2.5-4 us a job, against 1.0-1.4 here.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._created = time.time()
        self._finished: dict[tuple[str, str], int] = {}
        self._durations: dict[str, _Buckets] = {}
        self._attempts = _Buckets(ATTEMPT_BUCKETS)

    def record(self, runs: Iterable[tuple[str, Outcome, float, int]]) -> None:
        """Count a batch of handler runs, each (type, outcome, duration seconds, attempts)."""
        batch = list(runs)
        for _, outcome, _, _ in batch:
            if outcome not in _KNOWN_OUTCOMES:
                raise ValueError(
                    f"unknown outcome {outcome!r}; expected one of {', '.join(Outcome)}"
                )
        with self._lock:
            finished, durations, attempts = self._finished, self._durations, self._attempts
            for job_type, outcome, duration_seconds, tries in batch:
                key = (job_type, str(outcome))
                finished[key] = finished.get(key, 0) + 1
                series = durations.get(job_type)
                if series is None:
                    series = durations[job_type] = _Buckets(DURATION_BUCKETS)
                seconds = max(0.0, duration_seconds)
                series.counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
                series.total += seconds
                if outcome in FINAL_OUTCOMES:
                    attempts.counts[bisect.bisect_left(ATTEMPT_BUCKETS, tries)] += 1
                    attempts.total += tries

    def describe(self) -> list[Metric]:
        return self._families()

    def collect(self) -> list[Metric]:
        with self._lock:
            return self._families()

    def _families(self) -> list[Metric]:
        created = self._created
        finished = CounterMetricFamily(
            "rota_jobs_finished",
            "Jobs a worker let go of, by type and outcome (" + ", ".join(Outcome) + ").",
            labels=["type", "outcome"],
        )
        for (job_type, outcome), count in sorted(self._finished.items()):
            finished.add_metric([job_type, outcome], count, created=created)
        duration = HistogramMetricFamily(
            "rota_job_duration_seconds",
            "How long a handler ran, whatever its outcome, in seconds.",
            labels=["type"],
        )
        for job_type, series in sorted(self._durations.items()):
            duration.add_metric([job_type], series.cumulative(DURATION_BUCKETS), series.total)
        attempts = HistogramMetricFamily(
            "rota_job_attempts", "Attempts a job had used when it ended (done, failed or dead)."
        )
        attempts.add_metric([], self._attempts.cumulative(ATTEMPT_BUCKETS), self._attempts.total)
        return [finished, duration, attempts]


RUNS = RunCounter()
"""This process's counts, served by every registry `build_registry` makes."""


def record_outcome(job_type: str, outcome: Outcome, duration_seconds: float, attempts: int) -> None:
    """Count one handler run that ended with `outcome`; called by the worker."""
    RUNS.record([(job_type, outcome, duration_seconds, attempts)])


def record_outcomes(runs: Iterable[tuple[str, Outcome, float, int]]) -> None:
    """Count a batch of handler runs, each (type, outcome, duration seconds, attempts)."""
    RUNS.record(runs)


# -- serving it to Prometheus --------------------------------------------------------


def _families(status: QueueStatus | None) -> list[Metric]:
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
    paused = GaugeMetricFamily(
        "rota_job_type_paused",
        'Whether workers claim nothing of a job type (1: paused; type "*": every type).',
        labels=["type"],
    )
    missed = CounterMetricFamily(
        "rota_schedule_missed_slots",
        "Slots a schedule missed while no scheduler ran.",
        labels=["schedule"],
    )
    live_workers = GaugeMetricFamily(
        "rota_workers", "Live workers: registered in rota.worker, their rows not expired."
    )
    if status is not None:
        live_workers.add_metric([], status.workers)
        for job_type, measures in status.types.items():
            age.add_metric([job_type], measures.oldest_ready_age_seconds)
            running.add_metric([job_type], measures.running)
            for name in Status:
                jobs.add_metric([name.value, job_type], measures.count(name))
        dead.add_metric([], status.dead_jobs)
        expired.add_metric([], status.lease_expirations.total)
        for schedule in status.schedules:
            missed.add_metric([schedule.name], schedule.missed_slots)
        for job_type, measures in status.types.items():
            paused.add_metric([job_type], 1 if measures.paused else 0)
        if "*" in status.paused:
            paused.add_metric(["*"], 1)
    return [age, jobs, running, dead, expired, missed, paused, live_workers]


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
        self._status: QueueStatus | None = None
        self._read_at = -math.inf
        self.reads = 0
        """How many times the database was read (for tests and debugging)."""

    def describe(self) -> list[Metric]:
        return _families(None)

    def collect(self) -> Iterator[Metric]:
        yield from _families(self.status())

    def status(self) -> QueueStatus | None:
        """The latest measures, read again when the cached ones are too old."""
        with self._lock:
            if self._clock() - self._read_at >= self.cache_seconds:
                self._status = self._read()
                self._read_at = self._clock()
            return self._status

    def _read(self) -> QueueStatus | None:
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
    found.update((family.name, family.type) for family in RUNS.describe())
    return found


def build_registry(dsn: str, *, cache_seconds: float = 5.0) -> CollectorRegistry:
    """A registry with the database measures and this process's job counters."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(dsn, cache_seconds=cache_seconds))
    registry.register(RUNS)
    return registry
