"""Rota's side of the benchmark: enqueue rates, drain rates, enqueue-to-start latency.

Workers are real `rota worker` processes started the way an operator would
start them, with the reaper and scheduler off so that only the queue path is
measured. Every measurement gets a fresh, migrated database.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable

import psycopg

import rota
from bench.measure import Drain, Latency, enqueue_costed, spawn, timed_drain, timed_latency
from bench.server import Server
from rota import db
from rota.migrate import describe_key_index, use_key_index

NewDatabase = Callable[[str], str]
"""Creates an empty database with the given name and returns its URL."""

# Each count walks one partial index: `status IN ('ready', 'running')` can use
# neither, and beside 2,000,000 done rows it was a parallel scan of the whole
# table every 50 ms, which the measured server CPU counted against Rota.
REMAINING = (
    "SELECT (SELECT count(*) FROM rota.job WHERE status = 'ready')"
    " + (SELECT count(*) FROM rota.job WHERE status = 'running') AS count"
)
ANY_LEFT = (
    "SELECT EXISTS (SELECT FROM rota.job WHERE status = 'ready')"
    " OR EXISTS (SELECT FROM rota.job WHERE status = 'running')"
)
BATCH = 1000


def add_drain_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The options of the scripts that drain in alternating rounds (`bench.*_ab`)."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)


def check_drain_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if min(args.rounds, args.processes, args.jobs, args.concurrency) <= 0:
        parser.error("--rounds, --processes, --jobs and --concurrency must be positive")


def fresh(new_database: NewDatabase, name: str) -> str:
    dsn = new_database(name)
    rota.migrate(dsn)
    if KEY_INDEX != "constraint":
        use_key_index(dsn, KEY_INDEX)
    return dsn


KEY_INDEX = "constraint"
"""How Rota's databases keep idempotency keys unique (`python -m bench.run --key-index`):
the schema's constraint, or `rota migrate --key-index partial`."""


EXTRA_WORKER_ARGS: list[str] = []
"""More `rota worker` flags for every Rota worker (`python -m bench.run --worker-arg`)."""


def worker_command(concurrency: int) -> list[str]:
    return [
        "-m",
        "rota",
        "worker",
        "--handlers",
        "bench.handlers",
        "--concurrency",
        str(concurrency),
        "--lease",
        "30",
        "--no-scheduler",
        "--no-reaper",
        *EXTRA_WORKER_ARGS,
    ]


def start_workers(dsn: str, processes: int, concurrency: int) -> list:
    env = {"ROTA_DATABASE_URL": dsn}
    return [spawn(worker_command(concurrency), env) for _ in range(processes)]


def enqueue_single(dsn: str, jobs: int) -> float:
    """Jobs per second, one `rota.enqueue` (one transaction, one commit) each."""
    with db.connect(dsn) as conn:
        began = time.perf_counter()
        for i in range(jobs):
            rota.enqueue(conn, "bench.noop", {"i": i})
        return jobs / (time.perf_counter() - began)


def enqueue_batches(dsn: str, jobs: int, batch: int = BATCH) -> float:
    """Jobs per second with `rota.enqueue_many` of `batch` jobs per call."""
    with db.connect(dsn) as conn:
        began = time.perf_counter()
        for start in range(0, jobs, batch):
            rota.enqueue_many(
                conn,
                [
                    rota.NewJob("bench.noop", {"i": i})
                    for i in range(start, min(start + batch, jobs))
                ],
            )
        return jobs / (time.perf_counter() - began)


def drain(
    new_database: NewDatabase,
    jobs: int,
    processes: int,
    concurrency: int,
    server: Server | None = None,
    dsn: str | None = None,
    limit: int | None = None,
) -> Drain:
    """Pre-enqueue `jobs` no-op jobs, then time `processes` workers emptying the queue.

    On a fresh database, or on `dsn` as it is (e.g. one with many done rows).
    With `limit`, the jobs' type has that concurrency limit (rota.set_limit):
    every claim of them goes through the limited claim.
    """
    dsn = dsn or fresh(new_database, f"rota_drain_{processes}" + ("_limited" if limit else ""))
    after = _last_id(dsn)
    cpu, wal = enqueue_costed(server, dsn, lambda: enqueue_batches(dsn, jobs))
    if limit is not None:
        rota.set_limit(dsn, "bench.noop", concurrency=limit)
    drained = timed_drain(
        dsn,
        (REMAINING, ANY_LEFT),
        jobs,
        lambda: start_workers(dsn, processes, concurrency),
        f"concurrency {concurrency} per process (claims into the free slots,"
        " and a batch ahead while jobs end fast);"
        f" keys unique by the {describe_key_index(KEY_INDEX)}",
        server,
    )
    return dataclasses.replace(
        drained,
        enqueue_cpu_seconds=cpu,
        enqueue_wal_bytes=wal,
        history_rows=_done_since(dsn, after),
    )


def _last_id(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(b"SELECT coalesce(max(id), 0) FROM rota.job").fetchone()
        return int(row[0]) if row else 0


def _done_since(dsn: str, after: int) -> int:
    """The done rows of the jobs enqueued after id `after`: each job's history,
    one row that `rota jobs show` and the console read (none is archived here)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            b"SELECT count(*) FROM rota.job WHERE id > %s AND status = 'done'"
            b" AND finished_at IS NOT NULL AND started_at IS NOT NULL",
            (after,),
        ).fetchone()
        return int(row[0]) if row else 0


def with_done_rows(new_database: NewDatabase, rows: int) -> str:
    """A migrated database holding `rows` done jobs, vacuumed and analyzed.

    One INSERT ... SELECT from generate_series; the rows look like jobs that
    ran over the past day (finished_at spread over it), as a busy queue keeps
    them until the archiver moves them.
    """
    dsn = fresh(new_database, "rota_done_rows")
    add_done_rows(dsn, rows)
    return dsn


def add_done_rows(dsn: str, rows: int) -> None:
    """Add `rows` done jobs to the database at `dsn` (see with_done_rows)."""
    with db.connect(dsn) as conn:
        conn.execute(
            b"""
            INSERT INTO rota.job (type, payload, status, run_at, attempts, locked_by,
                                  created_at, started_at, finished_at)
            SELECT 'bench.noop', jsonb_build_object('i', g), 'done', t, 1, 'bench:0:old',
                   t, t, t + interval '1 millisecond'
            FROM generate_series(1, %(rows)s) AS g,
                 LATERAL (SELECT now() - interval '1 day'
                                 + g * (interval '1 day' / %(rows)s)) AS ts(t)
            """,
            {"rows": rows},
        )
        conn.execute(b"VACUUM ANALYZE rota.job")


def latency(new_database: NewDatabase, jobs: int, gap: float, concurrency: int = 10) -> Latency:
    """Enqueue-to-start delays of jobs sent one at a time to one idle worker."""
    dsn = fresh(new_database, "rota_latency")
    with db.connect(dsn) as conn:
        return timed_latency(
            lambda: start_workers(dsn, 1, concurrency),
            lambda payload: enqueue_latency_job(conn, payload),
            jobs,
            gap,
            f"1 worker, concurrency {concurrency}, woken by LISTEN/NOTIFY",
        )


def enqueue_latency_job(conn: db.Conn, payload: dict[str, object]) -> None:
    """What a latency round sends: one job in its own commit, to `bench.latency`."""
    rota.enqueue(conn, "bench.latency", payload)
