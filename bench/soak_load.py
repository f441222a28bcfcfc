"""`make soak-load`: Rota under a steady load for a long while, sampled as it goes.

Producers enqueue no-op jobs one per transaction at a steady rate (several
connections, as an application's requests would; with synchronous commit each
enqueue waits for the disk, so one connection alone cannot hold a high rate on
a slow disk); worker
processes drain them with the scheduler and reaper on, so the built-in
``rota/archive`` schedule runs as it would in production, here with a short
retention in its payload so that archiving really moves rows during the run.
Every sample (30 s by default) records the size of ``rota.job`` and of its
indexes, its live and dead tuples and autovacuum runs, and the enqueue-to-start
delays (``started_at - created_at``, both from the database clock) of the jobs
that started since the previous sample. The curve is printed as a table and
written as JSON.

    python -m bench.soak_load [--minutes 20] [--rate 200] [--producers 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import threading
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

import rota
from bench import rota_bench
from bench.measure import crashed, spawn, stop, wait_until
from bench.server import server_cpu_seconds
from rota.schedules import ScheduleSpec, upsert

SAMPLE_SQL = """
SELECT pg_relation_size('rota.job') AS table_bytes,
       pg_indexes_size('rota.job') AS index_bytes,
       pg_total_relation_size('rota.job') AS total_bytes,
       s.n_live_tup, s.n_dead_tup, s.last_autovacuum, s.autovacuum_count,
       s.last_autoanalyze, s.autoanalyze_count,
       (SELECT count(*) FROM rota.job WHERE status = 'ready') AS ready,
       (SELECT count(*) FROM rota.job WHERE status = 'running') AS running,
       (SELECT count(*) FROM rota.job_archive) AS archived
FROM pg_stat_user_tables s
WHERE s.relid = 'rota.job'::regclass
"""

# Jobs that started in a window, wherever they are now (archiving moves them).
WINDOW_SQL = """
WITH started AS (
    SELECT started_at - created_at AS delay FROM rota.job
    WHERE type = 'bench.noop' AND started_at >= %(since)s AND started_at < %(until)s
    UNION ALL
    SELECT started_at - created_at FROM rota.job_archive
    WHERE type = 'bench.noop' AND started_at >= %(since)s AND started_at < %(until)s
)
SELECT count(*) AS started,
       1000 * extract(epoch FROM percentile_disc(0.5) WITHIN GROUP (ORDER BY delay))
           AS p50_ms,
       1000 * extract(epoch FROM percentile_disc(0.99) WITHIN GROUP (ORDER BY delay))
           AS p99_ms,
       1000 * extract(epoch FROM max(delay)) AS max_ms
FROM started
"""


class Producer(threading.Thread):
    """Enqueues one job per transaction, `rate` a second, on a fixed timetable."""

    def __init__(self, dsn: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate = dsn, rate
        self.halt = threading.Event()
        self.sent = 0
        self.behind = 0.0
        """How far behind the timetable the latest enqueue was (seconds)."""
        self.worst = 0.0
        """The furthest behind it ever was."""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with rota.db.connect(self.dsn) as conn:
                began = time.monotonic()
                while not self.halt.is_set():
                    due = began + self.sent / self.rate
                    lag = time.monotonic() - due
                    if lag < 0:
                        self.halt.wait(-lag)
                        continue
                    self.behind, self.worst = lag, max(self.worst, lag)
                    rota.enqueue(conn, "bench.noop", {"i": self.sent})
                    self.sent += 1
        except BaseException as exc:  # reported by the main thread
            self.error = exc


class Producers:
    """`count` producers sharing a rate."""

    def __init__(self, dsn: str, rate: float, count: int) -> None:
        self.each = [Producer(dsn, rate / count) for _ in range(count)]

    def start(self) -> None:
        for p in self.each:
            p.start()

    def stop(self) -> None:
        for p in self.each:
            p.halt.set()
        for p in self.each:
            p.join(10)

    @property
    def sent(self) -> int:
        return sum(p.sent for p in self.each)

    @property
    def behind(self) -> float:
        return max(p.behind for p in self.each)

    @property
    def worst(self) -> float:
        return max(p.worst for p in self.each)

    @property
    def error(self) -> BaseException | None:
        return next((p.error for p in self.each if p.error is not None), None)


def set_archive(dsn: str, retention: float, cron: str) -> None:
    """The built-in archive schedule, with a short retention so that it moves rows."""
    upsert(
        dsn,
        ScheduleSpec(
            name="rota/archive",
            job_type="rota.archive",
            cron=cron,
            payload={"done_retention_seconds": retention, "failed_retention_seconds": retention},
            concurrency_policy="Forbid",
            max_attempts=3,
        ),
    )


def sample(conn: psycopg.Connection[Any], since: Any, until: Any) -> dict[str, Any]:
    row = conn.execute(SAMPLE_SQL.encode()).fetchone()
    window = conn.execute(WINDOW_SQL.encode(), {"since": since, "until": until}).fetchone()
    assert row is not None and window is not None
    return {**row, **window}


def soak(
    dsn: str,
    postmaster: int | None,
    minutes: float,
    rate: float,
    every: float,
    workers: int,
    concurrency: int,
    retention: float,
    cron: str,
    producers: int = 4,
    say: Any = print,
) -> dict[str, Any]:
    rota.migrate(dsn)
    set_archive(dsn, retention, cron)
    env = {"ROTA_DATABASE_URL": dsn}
    command = rota_bench.worker_command(concurrency)
    command = [c for c in command if c not in ("--no-scheduler", "--no-reaper")]
    processes = [spawn(command, env) for _ in range(workers)]
    producer = Producers(dsn, rate, producers)
    samples: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        try:

            def clock() -> Any:
                row = conn.execute(b"SELECT now() AS t").fetchone()
                assert row is not None
                return row["t"]

            # The clock starts once a worker runs jobs, not while processes import.
            rota.enqueue(conn, "bench.noop", {"warm-up": True})
            wait_until(
                lambda: not _count(conn, rota_bench.REMAINING),
                120,
                "the workers to start",
            )
            began = time.monotonic()
            last, cpu = clock(), _cpu(postmaster)
            producer.start()
            while time.monotonic() - began < minutes * 60:
                wait_until(
                    lambda: (
                        producer.error is not None
                        or crashed(processes) is not None
                        or time.monotonic() - began >= (len(samples) + 1) * every
                    ),
                    every + 60,
                    "the next sample",
                )
                failure = crashed(processes) or (producer.error and repr(producer.error))
                if failure:
                    raise RuntimeError(failure)
                now, cpu_now = clock(), _cpu(postmaster)
                found = sample(conn, last, now)
                found["elapsed_s"] = round(time.monotonic() - began, 1)
                found["server_cpu_s"] = (
                    None if cpu is None or cpu_now is None else round(cpu_now - cpu, 2)
                )
                found["enqueued"] = producer.sent
                found["producer_lag_s"] = round(producer.behind, 3)
                samples.append(found)
                say(_row(found))
                last, cpu = now, cpu_now
        finally:
            producer.stop()
            stop(processes)
    return {
        "settings": {
            "minutes": minutes,
            "rate_per_s": rate,
            "sample_every_s": every,
            "workers": workers,
            "concurrency": concurrency,
            "archive_cron": cron,
            "retention_s": retention,
            "producers": producers,
            "enqueue": "one job per transaction (rota.enqueue)",
        },
        "enqueued": producer.sent,
        "producer_max_lag_s": round(producer.worst, 3),
        "samples": samples,
    }


def _count(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query.encode()).fetchone()
    return int(row["count"]) if row else 0


def _cpu(postmaster: int | None) -> float | None:
    return None if postmaster is None else server_cpu_seconds(postmaster)


HEADER = (
    "| min | table MB | indexes MB | live | dead | autovacuums | ready | archived "
    "| started/s | p50 ms | p99 ms | max ms | server CPU % | enqueue lag s |"
)


def _row(s: dict[str, Any], window: float | None = None) -> str:
    """One sample as a table row; with `window`, rates per second instead of counts."""
    cpu = s.get("server_cpu_s")
    started = s["started"] if window is None else s["started"] / window
    if cpu is not None and window is not None:
        cpu = 100 * cpu / window
    return (
        f"| {s['elapsed_s'] / 60:.1f} | {s['table_bytes'] / 2**20:.1f} "
        f"| {s['index_bytes'] / 2**20:.1f} | {s['n_live_tup']:,} | {s['n_dead_tup']:,} "
        f"| {s['autovacuum_count']} | {s['ready']:,} | {s['archived']:,} | {started:,.0f} "
        f"| {_f(s['p50_ms'])} | {_f(s['p99_ms'])} | {_f(s['max_ms'])} "
        f"| {'-' if cpu is None else f'{cpu:.1f}'} | {s.get('producer_lag_s', 0):.1f} |"
    )


def _f(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def table(result: dict[str, Any]) -> str:
    lines = [HEADER, "|" + "---:|" * (HEADER.count("|") - 1)]
    previous = 0.0
    for s in result["samples"]:
        lines.append(_row(s, max(s["elapsed_s"] - previous, 1e-9)))
        previous = s["elapsed_s"]
    return "\n".join(lines)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """First half against second half: what would show a drift."""
    samples = result["samples"]
    half = len(samples) // 2
    first, second = samples[:half] or samples, samples[half:] or samples

    def top(key: str, part: list[dict[str, Any]]) -> float:
        return max(float(s[key] or 0) for s in part)

    def median(key: str, part: list[dict[str, Any]]) -> float:
        values = sorted(float(s[key] or 0) for s in part)
        return values[len(values) // 2]

    return {
        "max_total_mb": {
            "first_half": top("total_bytes", first) / 2**20,
            "second_half": top("total_bytes", second) / 2**20,
        },
        "max_dead_tuples": {
            "first_half": top("n_dead_tup", first),
            "second_half": top("n_dead_tup", second),
        },
        "median_p50_ms": {
            "first_half": median("p50_ms", first),
            "second_half": median("p50_ms", second),
        },
        "median_p99_ms": {
            "first_half": median("p99_ms", first),
            "second_half": median("p99_ms", second),
        },
        "enqueued_per_s": (samples[-1]["enqueued"] / samples[-1]["elapsed_s"] if samples else 0.0),
        "autovacuums": int(samples[-1]["autovacuum_count"]) if samples else 0,
        "archived": int(samples[-1]["archived"]) if samples else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_load", description=__doc__)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--producers", type=int, default=4, help="enqueueing connections")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--retention", type=float, default=60.0, help="archive retention (seconds) for the run"
    )
    parser.add_argument("--archive-cron", default="*/5 * * * *", help="the built-in schedule's")
    parser.add_argument("--json", metavar="PATH", help="also write the curve as JSON")
    args = parser.parse_args(argv)
    if min(args.minutes, args.rate, args.sample_seconds, args.workers, args.producers) <= 0:
        parser.error("--minutes, --rate, --sample-seconds, --workers, --producers must be positive")
    logging.basicConfig(level=logging.WARNING)

    from bench.server import postmaster_pid
    from rota.testing import EmbeddedPostgres

    print(HEADER.replace("started/s", "started").replace("CPU %", "CPU s"), flush=True)
    with EmbeddedPostgres(durable=True) as server:
        result = soak(
            server.create_database("rota_soak"),
            postmaster_pid(server.data),
            args.minutes,
            args.rate,
            args.sample_seconds,
            args.workers,
            args.concurrency,
            args.retention,
            args.archive_cron,
            args.producers,
            say=lambda line: print(line, flush=True),
        )
    result["machine"] = f"{platform.machine()}, Python {platform.python_version()}"
    result["summary"] = summary(result)
    print()
    print(table(result))
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
