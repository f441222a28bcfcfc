"""What every queue's benchmark shares: timing a drain, spawning workers, percentiles.

A drain is timed from the outside, the same way for every queue: worker
processes start on a database where the jobs wait, and a separate connection
counts the unfinished jobs every few milliseconds until none are left. The
rate is taken from the first count that shows progress to the last, so the
seconds a process needs to import its library and connect do not count
against any queue; the wall time from spawning is reported beside it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import psycopg

from bench.server import Server, cpu_seconds_of

ROOT = Path(__file__).resolve().parent.parent
"""The repository: worker processes run here so `bench.*` modules import."""

POLL_SECONDS = 0.05
PYTHON = sys.executable
"""The interpreter of the worker processes spawned (bench.workers_ab sets another)."""
_logs: dict[int, IO[bytes]] = {}


@dataclasses.dataclass(frozen=True)
class Drain:
    """How fast some worker processes emptied a queue of no-op jobs."""

    jobs: int
    processes: int
    rate: float
    """Jobs per second from the first progress seen to the last job done."""
    wall_seconds: float
    """From spawning the processes until the last job was done."""
    settings: str
    server_cpu_seconds: float | None = None
    """PostgreSQL's CPU from spawning to the last job done (None: not measured), the
    backend of the connection watching the queue left out."""
    wal_bytes: int | None = None
    commits: int | None = None
    """Commits in the drain's database, the counting connection's own left out."""
    vacuum_cpu_seconds: float | None = None
    """PostgreSQL's CPU for a VACUUM ANALYZE of the drained database, run after the drain."""
    vacuum_wal_bytes: int | None = None
    worker_cpu_seconds: float | None = None
    """The worker processes' own CPU (every thread) from the first progress seen to
    the last job done, their start (imports, connecting) left out; from spawning
    them, for a queue found empty at the first look."""
    worker_jobs: int | None = None
    """The jobs done over that span (those left at the first progress, or all)."""
    enqueue_cpu_seconds: float | None = None
    """PostgreSQL's CPU for enqueueing the drain's jobs (in batches of 1,000), before it."""
    enqueue_wal_bytes: int | None = None
    watch_cpu_seconds: float | None = None
    """The CPU of the watching connection's backend over the drain (its counts and
    existence checks): the harness's, not the queue's, so not in server_cpu_seconds."""
    history_rows: int | None = None
    """Rows that record the drained jobs as done once the drain is over (Rota: its
    rows in rota.job; None for a queue that keeps no such row)."""

    @property
    def cpu_with_enqueue_per_1000_jobs(self) -> float | None:
        """The server's CPU for enqueueing and draining the jobs, per 1,000."""
        if self.server_cpu_seconds is None or self.enqueue_cpu_seconds is None:
            return None
        return self._per_job(self.server_cpu_seconds + self.enqueue_cpu_seconds, 1000)

    @property
    def wal_with_enqueue_per_job(self) -> float | None:
        if self.wal_bytes is None or self.enqueue_wal_bytes is None:
            return None
        return self._per_job(self.wal_bytes + self.enqueue_wal_bytes)

    @property
    def history_rows_per_job(self) -> float | None:
        return self._per_job(self.history_rows)

    @property
    def cpu_seconds_per_1000_jobs(self) -> float | None:
        return self._per_job(self.server_cpu_seconds, 1000)

    @property
    def worker_cpu_seconds_per_1000_jobs(self) -> float | None:
        return self._per_job(self.worker_cpu_seconds, 1000, self.worker_jobs)

    @property
    def wal_bytes_per_job(self) -> float | None:
        return self._per_job(self.wal_bytes)

    @property
    def commits_per_job(self) -> float | None:
        return self._per_job(self.commits)

    @property
    def watch_cpu_seconds_per_1000_jobs(self) -> float | None:
        return self._per_job(self.watch_cpu_seconds, 1000)

    @property
    def vacuum_cpu_seconds_per_1000_jobs(self) -> float | None:
        return self._per_job(self.vacuum_cpu_seconds, 1000)

    @property
    def vacuum_wal_bytes_per_job(self) -> float | None:
        return self._per_job(self.vacuum_wal_bytes)

    def _per_job(
        self, total: float | None, jobs_per_unit: int = 1, over: int | None = None
    ) -> float | None:
        """`total` over the drain's jobs, or `over` jobs (per `jobs_per_unit` jobs);
        None: not measured."""
        jobs = self.jobs if over is None else over
        return None if total is None or not jobs else jobs_per_unit * total / jobs


@dataclasses.dataclass(frozen=True)
class Latency:
    """Enqueue-to-start delays of jobs enqueued one at a time to an idle worker."""

    jobs: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    settings: str
    enqueue_p50_ms: float | None = None
    """How long the enqueue call itself took (its commit included), the median."""
    after_return_p50_ms: float | None = None
    """From the enqueue call's return (its commit acknowledged) to the start, the
    median: the queue's own part of the delay, without the host's commit (fsync)
    time. Below 0 when the job started before the acknowledgement reached the
    client."""


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (`fraction` in 0..1) of `values`."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def latency_from_file(
    path: Path, settings: str, returned: dict[float, float] | None = None
) -> Latency:
    """Read the "enqueued started" lines that handlers appended (seconds, host clock);
    `returned` maps each job's enqueue time to when its enqueue call returned."""
    delays = []
    after_return = []
    for line in path.read_text().splitlines():
        enqueued, started = (float(x) for x in line.split())
        delays.append((started - enqueued) * 1000)
        if returned is not None and enqueued in returned:
            after_return.append((started - returned[enqueued]) * 1000)
    return Latency(
        jobs=len(delays),
        p50_ms=percentile(delays, 0.5),
        p99_ms=percentile(delays, 0.99),
        max_ms=max(delays),
        settings=settings,
        after_return_p50_ms=percentile(after_return, 0.5) if after_return else None,
    )


def record_start(path: str, enqueued: float) -> None:
    """What a latency handler does first: note when it started, beside when it was enqueued."""
    started = time.time()
    with open(path, "a") as out:
        out.write(f"{enqueued!r} {started!r}\n")


def spawn(
    args: Sequence[str], env: dict[str, str] | None = None, program: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a worker process in the repository, a Python one unless `program` names
    another; its log goes to a temporary file."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
    process = subprocess.Popen(
        [program or PYTHON, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    _logs[process.pid] = log
    return process


def stop(processes: Sequence[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM every process, wait for them, and fail loudly if one crashed."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log = _logs.pop(p.pid, None)
        if log is not None:
            log.close()


def crashed(processes: Sequence[subprocess.Popen[bytes]]) -> str | None:
    """The stderr of the first worker that exited on its own, if any did."""
    for p in processes:
        if p.poll() is not None:
            log = _logs[p.pid]
            log.seek(0)
            err = log.read().decode(errors="replace")
            return f"worker exited with {p.returncode}: {err[-2000:]}"
    return None


def timed_drain(
    dsn: str,
    remaining: tuple[str, str],
    jobs: int,
    start: Callable[[], list[subprocess.Popen[bytes]]],
    settings: str,
    server: Server | None = None,
    timeout: float = 600.0,
) -> Drain:
    """Start the workers and watch the queue until no job is left.

    `remaining` is a count of the jobs left and a cheaper query that tells only
    whether any is left: the count runs until the first progress shows (the
    rate is measured from there), then the existence check, so the watching
    connection costs the server little, whatever the queue.

    With `server`, also what the server spent: CPU and WAL from spawning the
    workers to the count that reads zero, commits from spawning until the
    workers' backends are gone (a backend's statistics are complete only once
    it has exited); the counting connection's own CPU and commits are left out
    (its CPU is kept apart, in `watch_cpu_seconds`). Then
    a VACUUM ANALYZE of the database, its CPU and WAL measured on their own:
    the dead rows a drain leaves, and the statistics its changes call for, are
    the queue's cost, and taken here they are not taken later by autovacuum
    inside another queue's measurement.
    """
    database = dsn.rsplit("/", 1)[-1].split("?")[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        _settle(conn)
    if server is not None:
        server.settled(database)
        commits_before = server.commits(database)
        before = server.read()
    polls = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        watcher = conn.info.backend_pid
        watch_before = cpu_seconds_of([watcher])
        spawned = time.perf_counter()
        processes = start()
        pids = [p.pid for p in processes]
        first: tuple[float, int] | None = None
        cpu_at_first = cpu_at_end = 0.0
        try:
            while True:
                now = time.perf_counter()
                left = _count(conn, remaining[0] if first is None else remaining[1])
                polls += 1
                if first is None and left < jobs:
                    first = (now, left)
                    cpu_at_first = cpu_seconds_of(pids)
                if left == 0:
                    cpu_at_end = cpu_seconds_of(pids)
                    break
                if now - spawned > timeout:
                    raise RuntimeError(f"drain did not finish in {timeout}s ({left} left)")
                failure = crashed(processes)
                if failure:
                    raise RuntimeError(failure)
                time.sleep(POLL_SECONDS)
            watched = cpu_seconds_of([watcher]) - watch_before
            after = server.read() if server is not None else None
        finally:
            stop(processes)
    assert first is not None
    since, left_then = first
    rate = left_then / max(now - since, 1e-9) if left_then else jobs / max(now - spawned, 1e-9)
    # From the first progress on, unless that span is too short to show: a queue
    # emptied before the first look, or one whose last jobs took less CPU than one
    # clock tick of /proc (tiny counts, a busy machine). Then the whole run, start
    # included.
    resolved = left_then and cpu_at_end > cpu_at_first
    worker_cpu = cpu_at_end - cpu_at_first if resolved else cpu_at_end
    worker_jobs = left_then if resolved else jobs
    drain = Drain(
        jobs,
        len(processes),
        rate,
        now - spawned,
        settings,
        worker_cpu_seconds=worker_cpu,
        worker_jobs=worker_jobs,
    )
    if server is None or after is None:
        return drain
    server.settled(database)
    commits = server.commits(database) - commits_before - polls
    vacuum_before = server.read()
    vacuum(dsn)
    vacuum_after = server.read()
    return dataclasses.replace(
        drain,
        # The watcher's backend is one of the server's children, so this is never
        # less than zero but for the float subtraction of equal clock ticks.
        server_cpu_seconds=max(0.0, after.cpu_seconds - before.cpu_seconds - watched),
        watch_cpu_seconds=watched,
        wal_bytes=after.wal_lsn - before.wal_lsn,
        commits=commits,
        vacuum_cpu_seconds=vacuum_after.cpu_seconds - vacuum_before.cpu_seconds,
        vacuum_wal_bytes=vacuum_after.wal_lsn - vacuum_before.wal_lsn,
    )


REAPED_SECONDS = 0.2
"""A pause after the last backend of a database left, before the server's CPU is
read: an exited backend's CPU reaches the postmaster's cutime only once the
postmaster has reaped it, and read before that it would count nowhere."""


def enqueue_costed(
    server: Server | None, dsn: str, enqueue: Callable[[], object]
) -> tuple[float | None, int | None]:
    """Run `enqueue` (on connections of its own to `dsn`, closed when it returns);
    what the server spent on it: CPU seconds and WAL bytes (None, None without a
    server)."""
    if server is None:
        enqueue()
        return None, None
    database = dsn.rsplit("/", 1)[-1].split("?")[0]
    server.settled(database)
    time.sleep(REAPED_SECONDS)
    before = server.read()
    enqueue()
    server.settled(database)
    time.sleep(REAPED_SECONDS)
    after = server.read()
    return after.cpu_seconds - before.cpu_seconds, after.wal_lsn - before.wal_lsn


def take_turns(
    setups: dict[str, Callable[[int], Drain]], rounds: int, say: Callable[[str], None]
) -> dict[str, dict[int, list[Drain]]]:
    """Drain each setup with 1 and 2 processes, every round; each round starts
    with another setup, so that none always runs first (or last) on the server."""
    found: dict[str, dict[int, list[Drain]]] = {name: {1: [], 2: []} for name in setups}
    names = list(setups)
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            for processes in (1, 2):
                say(f"round {round_ + 1}: {name}, {processes} process(es)")
                found[name][processes].append(setups[name](processes))
    return found


def median_of(drains: Sequence[Drain], attr: str) -> float:
    """The median of a Drain attribute over the drains that have it (NaN if none)."""
    values = [getattr(d, attr) for d in drains if getattr(d, attr) is not None]
    return statistics.median(values) if values else math.nan


def drain_table(
    found: dict[str, dict[int, list[Drain]]], columns: Sequence[tuple[str, str, str]]
) -> str:
    """A Markdown table of the drains by setup and processes: the rate's median and
    range, then each (header, Drain attribute, format) column's median."""
    lines = [
        "| setup | processes | jobs/s (median, min-max) | "
        + " | ".join(header for header, _, _ in columns)
        + " |",
        "|---|---:|---:|" + "---:|" * len(columns),
    ]
    for name, by_processes in found.items():
        for processes, runs in by_processes.items():
            if not runs:
                continue
            rates = [d.rate for d in runs]
            cells = [format(median_of(runs, attr), spec) for _, attr, spec in columns]
            lines.append(
                f"| {name} | {processes} | {statistics.median(rates):,.0f} "
                f"({min(rates):,.0f}-{max(rates):,.0f}) | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def vacuum(dsn: str) -> None:
    """VACUUM and ANALYZE every table of a database, the catalogs included, so that
    autovacuum finds nothing left to do there: neither dead rows nor changes to
    take statistics of."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(b"VACUUM ANALYZE")


def _count(conn: psycopg.Connection, query: str) -> int:
    row = conn.execute(query.encode()).fetchone()
    return int(row[0]) if row else 0


def _settle(conn: psycopg.Connection, timeout: float = 120.0) -> None:
    """Same start for every queue: its jobs vacuumed and analyzed, no autovacuum
    running anywhere in the server (its CPU and WAL would count in this drain),
    no checkpoint pending mid-run."""
    conn.execute(b"VACUUM ANALYZE")
    deadline = time.monotonic() + timeout
    while _count(
        conn, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
    ):
        if time.monotonic() > deadline:
            print(
                f"autovacuum still running after {timeout:.0f}s; measuring anyway", file=sys.stderr
            )
            break
        time.sleep(0.05)
    conn.execute(b"CHECKPOINT")


def timed_latency(
    start: Callable[[], list[subprocess.Popen[bytes]]],
    send: Callable[[dict[str, object]], None],
    jobs: int,
    gap: float,
    settings: str,
) -> Latency:
    """Enqueue `jobs` one at a time, `gap` seconds apart, to one idle worker.

    Each payload carries the host time just before the enqueue call and a file
    the handler appends its own start time to: worker and benchmark share the
    host clock, and the delay includes the enqueue's commit.
    """
    workdir = Path(tempfile.mkdtemp(prefix="rota-bench-"))
    workers = start()
    try:
        warm = workdir / "warm-up"
        _send_timed(send, warm, 5, gap)
        wait_until(lambda: _lines(warm) == 5, 60, "the worker to start")
        measured = workdir / "latency"
        returned = _send_timed(send, measured, jobs, gap)
        wait_until(lambda: _lines(measured) == jobs, 60, "the latency jobs")
    finally:
        stop(workers)
    enqueue_p50 = percentile([(end - began) * 1000 for began, end in returned.items()], 0.5)
    note = f"{settings}; the enqueue call alone: p50 {enqueue_p50:.2f} ms"
    found = latency_from_file(measured, note, returned)
    return dataclasses.replace(found, enqueue_p50_ms=enqueue_p50)


def _send_timed(
    send: Callable[[dict[str, object]], None], path: Path, jobs: int, gap: float
) -> dict[float, float]:
    """Send latency jobs; return when each enqueue call returned, by when it began
    (the time its payload carries; host clock, seconds)."""
    returned = {}
    for _ in range(jobs):
        began = time.time()
        send({"t": began, "path": str(path)})
        returned[began] = time.time()
        time.sleep(gap)
    return returned


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)
