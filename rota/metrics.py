"""The queue's measures, for Prometheus and for `rota status`.

Two kinds of measure live here, served by different processes so that every
series exists once per installation:

- The queue-wide measures (jobs by status, the age of the oldest ready job,
  running jobs, dead letters and deaths, lease expirations, missed schedule
  slots, paused types, live workers) are read by `read_status` with queries
  that touch only partial indexes and small side tables, never every row of
  ``rota.job``. `QueueCollector` serves them. Any number of processes may run
  one (the operator does, `rota exporter` does); only the one holding the
  database's exporter lock serves them, the others serve
  ``rota_queue_exporter_leader 0``, so a ``sum()`` over a database never counts
  a figure twice. Reads are cached for a few seconds, so any number of scrapers
  costs one round of queries.
- A worker's own measures (jobs it finished by outcome, handler durations,
  attempts at the end, what it runs now, its slots) are counted by the worker
  (`record_outcomes`) and served by `WorkerCollector`.

The ``type`` label is bounded: a process gives at most `MetricsSettings.max_types`
job types a label of their own; the rest are folded into ``type="other"``.
No ``_created`` series are served.

This module never decides anything from what it measures: it only reports.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from rota import sql
from rota.db import Conn, connect, fetch_all, is_unavailable
from rota.errors import InvalidInput, RotaError
from rota.jobs import Outcome, Status
from rota.status import QueueStatus, TypeStatus, read_status

log = logging.getLogger(__name__)

FINAL_OUTCOMES = frozenset({Outcome.DONE, Outcome.FAILED, Outcome.DEAD, Outcome.CANCELLED})
"""Outcomes that end a job's life: only these feed the attempts histogram."""

DURATION_BUCKETS = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1, 1.5, 2, 3, 4, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1800, 3600,
)  # fmt: skip
"""Default upper bounds of `rota_job_duration_seconds`, in seconds: each at most
1.5 times the one below from 20 ms to 2 min, so an interpolated quantile is off
by less than half its value (the documented panels read p50 and p95)."""

ATTEMPT_BUCKETS = (*range(1, 21), 25, 30, 40, 50, 75, 100)
"""Upper bounds of `rota_job_attempts`: one bucket per whole number up to
`EXACT_ATTEMPTS`, so ``ceil(histogram_quantile(...))`` is the exact quantile."""

EXACT_ATTEMPTS = 20
"""Attempt quantiles are exact up to this many attempts."""

DEFAULT_MAX_TYPES = 50
"""Job types a process labels by name before folding the rest into "other"."""

OTHER_TYPE = "other"
"""The ``type`` label of every job type beyond `MetricsSettings.max_types`."""

_KNOWN_OUTCOMES = frozenset(Outcome)


@dataclasses.dataclass(frozen=True, slots=True)
class MetricsSettings:
    """What the operator of an installation may tune (`from_env` reads it)."""

    duration_buckets: tuple[float, ...] = DURATION_BUCKETS
    """Upper bounds of rota_job_duration_seconds (ROTA_METRICS_DURATION_BUCKETS)."""
    max_types: int = DEFAULT_MAX_TYPES
    """Job types labelled by name; the rest are "other" (ROTA_METRICS_MAX_TYPES)."""

    def __post_init__(self) -> None:
        bounds = self.duration_buckets
        if not bounds or any(b <= 0 or math.isinf(b) for b in bounds):
            raise InvalidInput(f"duration buckets must be positive seconds, not {bounds}")
        if list(bounds) != sorted(set(bounds)):
            raise InvalidInput(f"duration buckets must increase: {bounds}")
        if self.max_types < 1:
            raise InvalidInput(f"the most job types labelled must be 1 or more: {self.max_types}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> MetricsSettings:
        """ROTA_METRICS_DURATION_BUCKETS ("0.1,0.5,2") and ROTA_METRICS_MAX_TYPES."""
        fields: dict[str, Any] = {}
        text = environ.get("ROTA_METRICS_DURATION_BUCKETS", "").strip()
        if text:
            try:
                fields["duration_buckets"] = tuple(float(b) for b in text.split(","))
            except ValueError:
                raise InvalidInput(
                    f"ROTA_METRICS_DURATION_BUCKETS must be seconds separated by commas: {text!r}"
                ) from None
        text = environ.get("ROTA_METRICS_MAX_TYPES", "").strip()
        if text:
            try:
                fields["max_types"] = int(text)
            except ValueError:
                raise InvalidInput(f"ROTA_METRICS_MAX_TYPES must be a number: {text!r}") from None
        return cls(**fields)


class TypeLabels:
    """The ``type`` label of each job type: its name for the first `max_types`
    types given a label (`declare` first, then in the order they are seen), and
    "other" for every later one. A type's label never changes once given."""

    def __init__(self, max_types: int) -> None:
        self.max_types = max_types
        self._given: dict[str, str] = {}
        self._named = 0

    def declare(self, job_types: Iterable[str]) -> None:
        for job_type in job_types:
            self(job_type)

    def given(self) -> list[str]:
        return list(self._given.values())

    def __call__(self, job_type: str) -> str:
        label = self._given.get(job_type)
        if label is None:
            if self._named < self.max_types and job_type != OTHER_TYPE:
                label, self._named = job_type, self._named + 1
            else:
                label = OTHER_TYPE
            self._given[job_type] = label
        return label


class _Buckets:
    """One histogram series: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def add(self, bounds: tuple[float, ...], value: float) -> None:
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.total += value

    def cumulative(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        running = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*map(floatToGoString, bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class RunCounter:
    """A worker's own measures: finished jobs by outcome, durations, attempts.

    Counted a batch at a time under one lock: prometheus_client's metric objects
    take a lock per value they change (the sum and a bucket of each histogram, for
    every job): 2.5-4 us a job, against 1.0-1.4 here.
    """

    def __init__(self, settings: MetricsSettings | None = None) -> None:
        self._lock = threading.Lock()
        self.configure(settings or MetricsSettings())

    def configure(self, settings: MetricsSettings) -> None:
        """Start over with `settings` (a worker does this once, before its first job)."""
        with self._lock:
            self.settings = settings
            self._labels = TypeLabels(settings.max_types)
            self._finished: dict[tuple[str, str], int] = {}
            self._durations: dict[str, _Buckets] = {}
            self._attempts: dict[str, _Buckets] = {}
            self._stalls = 0

    def record_stall(self) -> None:
        """Count one stall of the worker's event loop."""
        with self._lock:
            self._stalls += 1

    def declare(self, job_types: Iterable[str]) -> None:
        """Serve the counters and histograms of these types from 0, before their first job ends.

        A counter series that appears with its first increment hides that
        increment from ``increase()``; declared types start at 0 instead, and
        get their labels first (in the order given)."""
        with self._lock:
            for job_type in job_types:
                label = self._labels(job_type)
                for outcome in Outcome:
                    self._finished.setdefault((label, str(outcome)), 0)
                if label not in self._durations:
                    self._durations[label] = _Buckets(self.settings.duration_buckets)
                if label not in self._attempts:
                    self._attempts[label] = _Buckets(ATTEMPT_BUCKETS)

    def record(self, runs: Iterable[tuple[str, Outcome, float, int]]) -> None:
        """Count a batch of handler runs, each (type, outcome, duration seconds, attempts)."""
        batch = list(runs)
        for _, outcome, _, _ in batch:
            if outcome not in _KNOWN_OUTCOMES:
                raise ValueError(
                    f"unknown outcome {outcome!r}; expected one of {', '.join(Outcome)}"
                )
        with self._lock:
            bounds = self.settings.duration_buckets
            finished, durations, attempts = self._finished, self._durations, self._attempts
            # A batch is mostly one type: its label and duration series are
            # looked up once per run of it.
            last_type: str | None = None
            label = ""
            series = _Buckets(())
            for job_type, outcome, duration_seconds, tries in batch:
                if job_type != last_type:
                    last_type, label = job_type, self._labels(job_type)
                    series = durations.get(label) or durations.setdefault(label, _Buckets(bounds))
                key = (label, str(outcome))
                finished[key] = finished.get(key, 0) + 1
                series.add(bounds, max(0.0, duration_seconds))
                if outcome in FINAL_OUTCOMES:
                    tried = attempts.get(label)
                    if tried is None:
                        tried = attempts[label] = _Buckets(ATTEMPT_BUCKETS)
                    tried.add(ATTEMPT_BUCKETS, max(0, tries))  # a row may hold any int

    def labels(self) -> list[str]:
        """The ``type`` labels given so far (declared types first)."""
        with self._lock:
            return sorted(set(self._labels.given()))

    def label(self, job_type: str) -> str:
        """The ``type`` label this counter gives `job_type`."""
        with self._lock:
            return self._labels(job_type)

    def describe(self) -> list[Metric]:
        return self._families()

    def collect(self) -> list[Metric]:
        with self._lock:
            return self._families()

    def _families(self) -> list[Metric]:
        finished = CounterMetricFamily(
            "rota_jobs_finished",
            "Attempts this worker let go of, by type and outcome (" + ", ".join(Outcome) + ").",
            labels=["type", "outcome"],
        )
        for (job_type, outcome), count in sorted(self._finished.items()):
            finished.add_metric([job_type, outcome], count)
        bounds = self.settings.duration_buckets
        duration = HistogramMetricFamily(
            "rota_job_duration_seconds",
            "How long a handler ran on this worker, whatever its outcome, in seconds.",
            labels=["type"],
        )
        for job_type, series in sorted(self._durations.items()):
            duration.add_metric([job_type], series.cumulative(bounds), series.total)
        attempts = HistogramMetricFamily(
            "rota_job_attempts",
            "Attempts a job had used when it ended on this worker (done, failed, dead or"
            " cancelled); one bucket per whole number up to 20.",
            labels=["type"],
        )
        for job_type, series in sorted(self._attempts.items()):
            attempts.add_metric([job_type], series.cumulative(ATTEMPT_BUCKETS), series.total)
        stalls = CounterMetricFamily(
            "rota_worker_loop_stalls",
            "Times this worker's event loop did not turn for loop_stall_seconds (1 s by"
            " default): a handler blocking it (time.sleep in an async def, say).",
        )
        stalls.add_metric([], self._stalls)
        return [finished, duration, attempts, stalls]


RUNS = RunCounter()
"""This process's counts, served by `worker_registry`."""


def record_outcome(job_type: str, outcome: Outcome, duration_seconds: float, attempts: int) -> None:
    """Count one handler run that ended with `outcome`; called by the worker."""
    RUNS.record([(job_type, outcome, duration_seconds, attempts)])


def record_outcomes(runs: Iterable[tuple[str, Outcome, float, int]]) -> None:
    """Count a batch of handler runs, each (type, outcome, duration seconds, attempts)."""
    RUNS.record(runs)


def record_loop_stall() -> None:
    """Count one stall of the worker's event loop; called by its heartbeat thread."""
    RUNS.record_stall()


class WorkerCollector:
    """What one worker is doing now: its slots and the jobs it runs, by type.

    `running` returns the types of the jobs the worker holds now (one entry per
    job); `slots` is its concurrency. Every worker serves `rota_worker_slots`,
    so an alert can tell a worker that is scraped from none at all."""

    def __init__(self, slots: int, running: Callable[[], Iterable[str]], runs: RunCounter) -> None:
        self.slots = slots
        self._running = running
        self._runs = runs

    def describe(self) -> list[Metric]:
        return self._families(())

    def collect(self) -> list[Metric]:
        return self._families(self._running())

    def _families(self, running: Iterable[str]) -> list[Metric]:
        slots = GaugeMetricFamily(
            "rota_worker_slots", "Jobs this worker may run at once (its concurrency)."
        )
        slots.add_metric([], self.slots)
        mine = GaugeMetricFamily(
            "rota_worker_running_jobs",
            "Jobs this worker runs now, by type (0 for each type it handles and runs none of).",
            labels=["type"],
        )
        counts = dict.fromkeys(self._runs.labels(), 0)  # every type it handles, from 0
        for job_type in running:
            label = self._runs.label(job_type)
            counts[label] = counts.get(label, 0) + 1
        for label, count in sorted(counts.items()):
            mine.add_metric([label], count)
        return [slots, mine]


# -- the queue-wide measures -----------------------------------------------------------


def _fold(types: Mapping[str, TypeStatus], named: Set[str]) -> dict[str, TypeStatus]:
    """The types in `named` as they are; the rest summed into "other" (its age the
    oldest of theirs, paused only when all of them are)."""
    kept = {name: measures for name, measures in types.items() if name in named}
    rest = [measures for name, measures in types.items() if name not in named]
    if rest:
        fields = {
            f.name: sum(getattr(t, f.name) for t in rest)
            for f in dataclasses.fields(TypeStatus)
            if f.type in ("int", int)
        }
        kept[OTHER_TYPE] = TypeStatus(
            **fields,
            oldest_ready_age_seconds=max(t.oldest_ready_age_seconds for t in rest),
            paused=all(t.paused for t in rest),
        )
    return kept


@dataclasses.dataclass(frozen=True, slots=True)
class QueueReading:
    """One read of the queue-wide measures."""

    status: QueueStatus
    dead_totals: dict[str, int]
    """Jobs that ever went dead, by type."""


def _queue_families(reading: QueueReading | None, max_types: int) -> list[Metric]:
    """The queue-wide measures as metric families (empty families without `reading`)."""
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
    waiting = GaugeMetricFamily(
        "rota_waiting_jobs",
        "Jobs waiting on a sleep, an event or their children (no worker holds them), by type.",
        labels=["type"],
    )
    dead = GaugeMetricFamily("rota_dead_jobs", "Jobs in the dead-letter list (status dead).")
    deaths = CounterMetricFamily(
        "rota_jobs_dead",
        "Jobs that went dead (max_attempts used up), ever, by type; `dead retry` and"
        " archiving never lower it.",
        labels=["type"],
    )
    expired = CounterMetricFamily(
        "rota_lease_expirations", "Leases the reaper found expired (worker gone), ever."
    )
    paused = GaugeMetricFamily(
        "rota_job_type_paused",
        'Whether workers claim nothing of a job type (1: paused; type "*": every type).',
        labels=["type"],
    )
    limited = GaugeMetricFamily(
        "rota_job_type_limited",
        "Whether a limit of a job type holds some of its due jobs back (1: limited).",
        labels=["type"],
    )
    missed = CounterMetricFamily(
        "rota_schedule_missed_slots",
        "Slots a schedule missed while no scheduler ran, with the schedule's job type.",
        labels=["schedule", "type"],
    )
    live_workers = GaugeMetricFamily(
        "rota_workers",
        "Live workers: registered in rota.worker, row not expired, connection still open.",
    )
    if reading is not None:
        status = reading.status
        every = {*status.types, *reading.dead_totals, *(s.job_type for s in status.schedules)}
        named = set(sorted(every - {OTHER_TYPE})[:max_types])

        def label(job_type: str) -> str:
            return job_type if job_type in named else OTHER_TYPE

        live_workers.add_metric([], status.workers)
        folded = _fold(status.types, named)
        for job_type, measures in folded.items():
            age.add_metric([job_type], measures.oldest_ready_age_seconds)
            running.add_metric([job_type], measures.running)
            waiting.add_metric([job_type], measures.waiting)
            for name in Status:
                jobs.add_metric([name.value, job_type], measures.count(name))
            paused.add_metric([job_type], 1 if measures.paused else 0)
        if "*" in status.paused and "*" not in folded:  # a job type "*" has its series already
            paused.add_metric(["*"], 1)
        dead.add_metric([], status.dead_jobs)
        totals = {label(job_type): 0 for job_type in status.types}  # from 0, not from the first
        for job_type, total in reading.dead_totals.items():
            totals[label(job_type)] = totals.get(label(job_type), 0) + total
        for job_type, total in sorted(totals.items()):
            deaths.add_metric([job_type], total)
        expired.add_metric([], status.lease_expirations.total)
        for schedule in status.schedules:
            missed.add_metric([schedule.name, label(schedule.job_type)], schedule.missed_slots)
        flags: dict[str, int] = {}
        for limit in status.limits:
            flags[label(limit.type)] = max(flags.get(label(limit.type), 0), int(limit.limited))
        for job_type, flag in sorted(flags.items()):
            limited.add_metric([job_type], flag)
    return [
        age,
        jobs,
        running,
        waiting,
        dead,
        deaths,
        expired,
        missed,
        paused,
        limited,
        live_workers,
    ]


class QueueCollector:
    """Serves the queue-wide measures, once per database, at most one read per interval.

    Before each read it takes (or finds it holds) the exporter lock on its own
    connection; without it, it serves only ``rota_queue_exporter_leader 0``.
    The lock goes with the connection, so when the serving process dies another
    takes over at its next scrape. Scrapes within `cache_seconds` of the last
    read share its result. A failed read is remembered for the interval too;
    while the database is unreachable the measures are absent, never stale.
    """

    def __init__(
        self,
        dsn: str,
        *,
        cache_seconds: float = 5.0,
        settings: MetricsSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dsn = dsn
        self.cache_seconds = cache_seconds
        self.settings = settings or MetricsSettings()
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: Conn | None = None
        self._reading: QueueReading | None = None
        self._leader: bool | None = None
        self._read_at = -math.inf
        self.reads = 0
        """How many times the database was read (for tests and debugging)."""

    def describe(self) -> list[Metric]:
        return [*_queue_families(None, 1), self._leader_family(None)]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._clock() - self._read_at >= self.cache_seconds:
                self._leader, self._reading = self._read(lead=True)
                self._read_at = self._clock()
            leader, reading = self._leader, self._reading
        yield from _queue_families(reading if leader else None, self.settings.max_types)
        yield self._leader_family(leader)

    @staticmethod
    def _leader_family(leader: bool | None) -> Metric:
        family = GaugeMetricFamily(
            "rota_queue_exporter_leader",
            "1 when this process serves the queue-wide measures of its database, 0 when"
            " another one does.",
        )
        if leader is not None:
            family.add_metric([], 1 if leader else 0)
        return family

    def status(self) -> QueueStatus | None:
        """The queue-wide measures now, whoever serves them (None: database unreachable)."""
        with self._lock:
            _, reading = self._read(lead=False)
        return reading.status if reading is not None else None

    def _read(self, *, lead: bool) -> tuple[bool | None, QueueReading | None]:
        """(whether this process holds the exporter lock, None when the database
        is unreachable; the reading, None when not read)."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.dsn, application_name="rota-metrics")
            conn = self._conn
            leader = lead and bool(fetch_all(conn, sql.query("metrics_exporter_lead"))[0]["leader"])
            if lead and not leader:
                return False, None
            self.reads += 1
            totals = fetch_all(conn, sql.query("metrics_dead_totals"))
            return leader, QueueReading(
                read_status(conn), {r["type"]: int(r["total"]) for r in totals}
            )
        except RotaError as exc:
            log.warning("metrics: cannot read the database: %s", exc)
            if is_unavailable(exc):
                self.close_connection()
            return None, None

    def close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def metric_families() -> list[Metric]:
    """Every metric family Rota's worker and queue exporter serve, without samples
    (for tests and docs)."""
    return [
        *QueueCollector("").describe(),
        *RunCounter().describe(),
        *WorkerCollector(1, list, RUNS).describe(),
    ]


def metric_types() -> dict[str, str]:
    """Every metric Rota's worker and queue exporter serve, family name -> Prometheus
    type (for tests and docs)."""
    return {family.name: family.type for family in metric_families()}


def queue_registry(
    dsn: str, *, cache_seconds: float = 5.0, settings: MetricsSettings | None = None
) -> CollectorRegistry:
    """A registry with the queue-wide measures (what `rota exporter` serves)."""
    registry = CollectorRegistry()
    registry.register(QueueCollector(dsn, cache_seconds=cache_seconds, settings=settings))
    return registry


def worker_registry(slots: int, running: Callable[[], Iterable[str]]) -> CollectorRegistry:
    """A registry with this process's job counters and what it runs now (a worker's)."""
    registry = CollectorRegistry()
    registry.register(RUNS)
    registry.register(WorkerCollector(slots, running, RUNS))
    return registry


# -- serving over HTTP -----------------------------------------------------------------

Page = Callable[[], tuple[int, bytes, str]]
"""What a path answers: (status code, body, content type)."""


def cannot_listen(what: str, host: str, port: int, exc: OSError, option: str) -> RotaError:
    """The runtime error of a server that could not take its address (`rota` exits 1)."""
    reason = exc.strerror or str(exc)
    return RotaError(
        f"{what} could not listen on {host}:{port}: choose another {option} ({reason})"
    )


def serve_pages(
    host: str,
    port: int,
    pages: Mapping[str, Page],
    name: str,
    *,
    what: str = "the server",
    option: str = "port",
) -> ThreadingHTTPServer:
    """Serve `pages` (path -> its answer) from a thread of its own; other paths are 404.
    The server's `server_address` says the port it got (`port` 0: any free one). An
    address it cannot take (the port in use, a host not this one's) is a `RotaError`
    naming `what` serves and the `option` to change (`cannot_listen`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = pages.get(self.path)
            code, body, ctype = page() if page else (404, b"not found\n", "text/plain")
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise cannot_listen(what, host, port, exc, option) from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def metrics_page(registry: CollectorRegistry) -> Page:
    """The answer of /metrics: `registry` in Prometheus's text format."""
    return lambda: (200, generate_latest(registry), CONTENT_TYPE_LATEST)
