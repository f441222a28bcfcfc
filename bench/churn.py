"""`make bench-churn`: Rota and pgqueuer under steady churn and a long transaction.

What hurts a PostgreSQL queue in production is hours of churn and, above all,
one long transaction elsewhere in the database that keeps vacuum from removing
dead row versions: every claim then walks the index entries of the jobs claimed
since, and latency climbs. This benchmark plays that, one queue after the
other, on one durable PostgreSQL server (a fresh database each):

1. steady: producers enqueue jobs one per transaction at a fixed rate (by
   default half of the lower of the queues' measured drain capacities), two
   worker processes drain them;
2. held: the same load while another session of the same database holds a
   REPEATABLE READ snapshot open (longer than the steady phase);
3. released: the snapshot is let go, the load goes on.

Every sample (a few seconds) records the queue's hot table (Rota: rota.job;
pgqueuer: its queue table) with its indexes: size, live and dead tuples,
autovacuum runs; the backlog (jobs enqueued, not started); the server's and
the workers' CPU; the claim statement's calls and time from
pg_stat_statements. Each job carries the host time just before its enqueue
call and its handler appends the time it started, so enqueue-to-start is
measured the same way for every queue. Per phase, the tables give p50/p99 of
the jobs enqueued in it, claim time, backlog, size, dead tuples and
autovacuum runs; then the goals of the churn benchmark.

Durations scale with --scale: 1.0 (the default) is 60 s steady, 180 s held,
120 s released per queue, about 14 minutes in all for Rota and pgqueuer on
2 cores; 0.5 halves every phase, 3 makes the held phase nine minutes. Dead
entries a claim walks grow with the held phase's length times the rate, so a
longer hold (or a higher rate) only widens the gap a short one shows.

    python -m bench.churn [--scale 1.0] [--rate N] [--rota-setup NAME ...] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import logging
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

import rota
from bench import rota_bench
from bench.measure import crashed, percentile, spawn, stop, wait_until
from bench.peers import PgQueuer, PgQueuerUvloop, available
from bench.server import Server, cpu_seconds_of
from rota.schedule_store import ScheduleSpec, upsert

PHASES = ("steady", "held", "released")
Send = Callable[[list[dict[str, object]]], None]
"""Enqueue one job per payload, all in one transaction."""


@dataclasses.dataclass(frozen=True)
class Plan:
    steady: float = 60.0
    held: float = 180.0
    released: float = 120.0
    sample: float = 5.0
    rate: float | None = None
    """Jobs enqueued per second; None: half of the lower measured drain capacity."""
    max_rate: float | None = None
    """A cap on the measured rate (the smoke test's)."""
    capacity_jobs: int = 20_000
    """Jobs per drain that measures each queue's capacity (2 processes)."""
    producers: int = 4
    """Enqueueing connections (threads of the benchmark's process)."""
    per_transaction: int = 1
    """Jobs per enqueue transaction: 1 is an application enqueueing one job per
    request; on a busy 2-core machine the benchmark's own process cannot send
    more than a few hundred such transactions a second (32 connections held no
    more than 4), and a few jobs per transaction reach a higher rate."""
    concurrency: int = 50
    """Rota worker concurrency per process."""
    batch_size: int = 100
    """pgqueuer's batch size per process."""
    archive_retention: float = 30.0
    """Rota: seconds a done row stays in rota.job (the built-in archive schedule runs
    every minute with it), so that the hot set is what a production setting keeps."""
    drain_timeout: float = 120.0
    """After the last phase: how long the backlog may take to empty."""
    rota_setups: tuple[str, ...] = ("current",)
    peers: tuple[str, ...] = ("pgqueuer-uvloop",)

    def scaled(self, factor: float) -> Plan:
        return dataclasses.replace(
            self,
            steady=self.steady * factor,
            held=self.held * factor,
            released=self.released * factor,
            sample=max(1.0, self.sample * min(factor, 1.0)),
        )

    @classmethod
    def quick(cls, **changes: Any) -> Plan:
        """Tiny durations and rate for a smoke test: every figure, no meaningful number."""
        base = cls(
            steady=4.0,
            held=6.0,
            released=4.0,
            sample=1.0,
            max_rate=50.0,
            capacity_jobs=300,
            producers=2,
            concurrency=10,
            drain_timeout=60.0,
        )
        return dataclasses.replace(base, **changes)


# -- the queues ----------------------------------------------------------------
ROTA_SETUPS: dict[str, str] = {
    "current": "the schema `rota migrate` makes",
    "autovacuum-tuned": (
        "rota.job vacuumed after 1% + 1,000 dead rows with no cost delay (pgqueuer's"
        " recommended settings for its queue table, fillfactor aside)"
    ),
    "fillfactor-70": "rota.job at fillfactor 70",
}
"""Named variants of Rota's schema, so that a change is measured against the one
before in the same run (`--rota-setup`); each is applied after `rota migrate`."""

ROTA_SETUP_SQL: dict[str, str] = {
    "current": "",
    "autovacuum-tuned": (
        "ALTER TABLE rota.job SET (autovacuum_vacuum_scale_factor = 0.01,"
        " autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)"
    ),
    "fillfactor-70": "ALTER TABLE rota.job SET (fillfactor = 70)",
}


class Queue:
    """One queue under churn: its schema, workers, one enqueue, its hot tables."""

    name: str
    hot_table: str
    other_tables: tuple[str, ...]
    claim_like: str
    """A pattern of the claim statement's text in pg_stat_statements."""
    outcome_like: str
    """A pattern of the statement that records finished jobs."""

    def __init__(self, dsn: str, plan: Plan) -> None:
        self.dsn, self.plan = dsn, plan

    def install(self) -> None:
        raise NotImplementedError

    def start_workers(self) -> list[Any]:
        raise NotImplementedError

    def producer(self) -> Callable[[], AbstractContextManager[Send]]:
        """A context factory yielding one enqueue call, for a producer thread of its own."""
        raise NotImplementedError

    def settings(self) -> str:
        raise NotImplementedError


class RotaQueue(Queue):
    hot_table = "rota.job"
    other_tables = ("rota.job_archive",)
    claim_like = "%generate_series(%SKIP LOCKED%"
    """(pg_stat_statements writes the statement's constants as $1, $2...)"""
    outcome_like = "%INSERT INTO rota.job_done_count%"

    def __init__(self, dsn: str, plan: Plan, setup: str) -> None:
        super().__init__(dsn, plan)
        self.setup = setup
        self.name = "rota" if setup == "current" else f"rota ({setup})"

    def install(self) -> None:
        rota.migrate(self.dsn)
        extra = ROTA_SETUP_SQL[self.setup]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            if extra:
                conn.execute(extra.encode())
            # The built-in archive schedule, every minute, with a short retention,
            # so that rota.job holds what a production setting would keep.
            retention = self.plan.archive_retention
            upsert(
                conn,
                ScheduleSpec(
                    name="rota/archive",
                    job_type="rota.archive",
                    cron="* * * * *",
                    payload={
                        "done_retention_seconds": retention,
                        "failed_retention_seconds": retention,
                        "max_batches": 10_000,
                    },
                    concurrency_policy="Forbid",
                    max_attempts=3,
                ),
            )

    def start_workers(self) -> list[Any]:
        command = [
            c
            for c in rota_bench.worker_command(self.plan.concurrency)
            if c not in ("--no-scheduler", "--no-reaper")
        ]
        return [spawn(command, {"ROTA_DATABASE_URL": self.dsn}) for _ in range(2)]

    def producer(self) -> Callable[[], AbstractContextManager[Send]]:
        import contextlib

        @contextlib.contextmanager
        def opened() -> Iterator[Send]:
            with rota.db.connect(self.dsn) as conn:
                yield lambda payloads: _rota_send(conn, payloads)

        return opened

    def settings(self) -> str:
        return (
            f"2 processes, concurrency {self.plan.concurrency}, scheduler and reaper on, "
            f"done rows archived every minute after {self.plan.archive_retention:g} s; "
            f"{ROTA_SETUPS[self.setup]}"
        )


class PgQueuerQueue(Queue):
    hot_table = "pgqueuer"
    other_tables = ("pgqueuer_log",)
    claim_like = "%next_queued%SKIP LOCKED%"
    outcome_like = "%job_status AS%DELETE FROM%"

    def __init__(self, dsn: str, plan: Plan, uvloop: bool) -> None:
        super().__init__(dsn, plan)
        peer_type = PgQueuerUvloop if uvloop else PgQueuer
        self.peer = peer_type(dsn, batch_size=plan.batch_size)
        self.name = self.peer.name

    def install(self) -> None:
        async def install() -> None:
            conn, queries = await self.peer._queries()
            try:
                await queries.install()
                # Its documented autovacuum and fillfactor settings for queue tables.
                await queries.optimize_autovacuum()
            finally:
                await conn.close()

        asyncio.run(install())

    def start_workers(self) -> list[Any]:
        return [self.peer.spawn_worker() for _ in range(2)]

    def producer(self) -> Callable[[], AbstractContextManager[Send]]:
        import contextlib

        @contextlib.contextmanager
        def opened() -> Iterator[Send]:
            loop = asyncio.new_event_loop()
            peer = type(self.peer)(self.dsn, batch_size=self.plan.batch_size)
            loop.run_until_complete(peer.open())
            try:
                yield lambda payloads: loop.run_until_complete(_pgqueuer_send(peer, payloads))
            finally:
                loop.run_until_complete(peer.close())
                loop.close()

        return opened

    def settings(self) -> str:
        return (
            f"2 processes, {self.peer.settings()}, its optimize_autovacuum settings "
            "(autovacuum at 1% + 1,000 dead rows, no cost delay, fillfactor 70)"
        )


def _rota_send(conn: rota.db.Conn, payloads: list[dict[str, object]]) -> None:
    if len(payloads) == 1:
        rota_bench.enqueue_latency_job(conn, payloads[0])
    else:
        rota.enqueue_many(conn, [rota.NewJob("bench.latency", p) for p in payloads])


async def _pgqueuer_send(peer: PgQueuer, payloads: list[dict[str, object]]) -> None:
    if len(payloads) == 1:
        await peer.enqueue_latency_job(payloads[0])
    else:
        encoded = [json.dumps(p).encode() for p in payloads]
        await peer._queries_.enqueue(["latency"] * len(encoded), encoded, [0] * len(encoded))


# -- load ------------------------------------------------------------------------
class Producer(threading.Thread):
    """Enqueues `each` jobs per transaction, `rate` jobs a second, on a fixed timetable."""

    def __init__(self, opened: Callable[[], Any], rate: float, path: Path, each: int = 1) -> None:
        super().__init__(daemon=True)
        self.opened, self.rate, self.path, self.each = opened, rate, path, each
        self.halt = threading.Event()
        self.sent = 0
        self.worst = 0.0
        """The furthest behind its timetable it ever was (seconds)."""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.opened() as send:
                began = time.monotonic()
                while not self.halt.is_set():
                    due = began + self.sent / self.rate
                    lag = time.monotonic() - due
                    if lag < 0:
                        self.halt.wait(-lag)
                        continue
                    self.worst = max(self.worst, lag)
                    t = time.time()
                    send([{"t": t, "path": str(self.path)}] * self.each)
                    self.sent += self.each
        except BaseException as exc:  # reported by the main thread
            self.error = exc


class Starts:
    """The "enqueued started" lines the handlers append, read as they grow."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.seen: list[tuple[float, float]] = []

    def read(self) -> int:
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
            self.offset += len(chunk)
            lines = (self.rest + chunk).split(b"\n")
            self.rest = lines.pop()
            for line in lines:
                enqueued, started = (float(x) for x in line.split())
                self.seen.append((enqueued, started))
        return len(self.seen)


SAMPLE_SQL = """
SELECT pg_relation_size(%(table)s::regclass) AS table_bytes,
       pg_indexes_size(%(table)s::regclass) AS index_bytes,
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count
FROM pg_stat_user_tables s WHERE s.relid = %(table)s::regclass
"""

CLAIM_SQL = """
SELECT coalesce(sum(calls), 0)::bigint AS calls,
       coalesce(sum(total_exec_time), 0)::float8 AS ms,
       coalesce(max(max_exec_time), 0)::float8 AS max_ms
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE %(like)s
"""


def _one(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> dict[str, Any]:
    row = conn.execute(query.encode(), params).fetchone()
    assert row is not None
    return dict(row)


def _total_bytes(conn: psycopg.Connection[Any], tables: tuple[str, ...]) -> int:
    row = conn.execute(
        b"SELECT coalesce(sum(pg_total_relation_size(t::regclass)), 0) AS b"
        b" FROM unnest(%(t)s::text[]) AS t",
        {"t": list(tables)},
    ).fetchone()
    return int(row["b"]) if row else 0


def churn(queue: Queue, server: Server | None, plan: Plan, rate: float, say: Any) -> dict[str, Any]:
    """Run the three phases on one queue; every sample and each phase's figures."""
    queue.install()
    workdir = Path(tempfile.mkdtemp(prefix="rota-churn-"))
    path = workdir / "starts"
    starts = Starts(path)
    samples: list[dict[str, Any]] = []
    boundaries: dict[str, float] = {}
    top: dict[str, list[dict[str, Any]]] = {}
    producers = [
        Producer(queue.producer(), rate / plan.producers, path, plan.per_transaction)
        for _ in range(plan.producers)
    ]
    holder = psycopg.connect(queue.dsn, autocommit=True)
    workers = queue.start_workers()
    pids = [p.pid for p in workers]
    with psycopg.connect(queue.dsn, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(b"CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        try:
            # Warm up: the workers run a few jobs before the clock starts.
            with queue.producer()() as send:
                for _ in range(5):
                    send([{"t": time.time(), "path": str(workdir / "warm-up")}])
            wait_until(
                lambda: _lines(workdir / "warm-up") >= 5 or crashed(workers) is not None,
                120,
                f"{queue.name}'s workers to start",
            )
            failure = crashed(workers)
            if failure:
                raise RuntimeError(failure)

            def reading() -> dict[str, Any]:
                found = _one(conn, SAMPLE_SQL, {"table": queue.hot_table})
                claim = _one(conn, CLAIM_SQL, {"like": queue.claim_like})
                outcome = _one(conn, CLAIM_SQL, {"like": queue.outcome_like})
                return {
                    **found,
                    "total_bytes": found["table_bytes"] + found["index_bytes"],
                    "other_bytes": _total_bytes(conn, queue.other_tables),
                    "claim_calls": claim["calls"],
                    "claim_ms": claim["ms"],
                    "claim_max_ms": claim["max_ms"],
                    "outcome_calls": outcome["calls"],
                    "outcome_ms": outcome["ms"],
                    "server_cpu_s": server.read().cpu_seconds if server else None,
                    "worker_cpu_s": cpu_seconds_of(pids),
                }

            began = time.monotonic()
            for p in producers:
                p.start()
            ends = list(itertools.accumulate([plan.steady, plan.held, plan.released]))
            previous = reading()
            statements_before = _statements(conn)
            for phase, end in zip(PHASES, ends, strict=True):
                if phase == "held":
                    holder.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute(b"SELECT count(*) FROM pg_class")
                elif phase == "released":
                    holder.execute(b"COMMIT")
                boundaries[phase] = time.time()
                say(f"{queue.name}: {phase} for {end - (time.monotonic() - began):.0f} s")
                while time.monotonic() - began < end - 1e-3:
                    wake = min(began + end, time.monotonic() + plan.sample)
                    while time.monotonic() < wake:
                        _check(workers, producers)
                        time.sleep(min(0.2, max(0.0, wake - time.monotonic())))
                    now = reading()
                    sent = sum(p.sent for p in producers)
                    started = starts.read()
                    sample = {
                        "phase": phase,
                        "elapsed_s": round(time.monotonic() - began, 2),
                        "wall": time.time(),
                        **now,
                        "sent": sent,
                        "started": started,
                        "backlog": max(sent - started, 0),
                        **_deltas(previous, now),
                    }
                    samples.append(sample)
                    previous = now
                statements_now = _statements(conn)
                top[phase] = _top_statements(statements_before, statements_now)
                statements_before = statements_now
            boundaries["end"] = time.time()
            for p in producers:
                p.halt.set()
            for p in producers:
                p.join(10)
            sent = sum(p.sent for p in producers)
            wait_until(
                lambda: starts.read() >= sent or crashed(workers) is not None,
                plan.drain_timeout,
                f"{queue.name}'s backlog to empty",
            )
        finally:
            for p in producers:
                p.halt.set()
            holder.close()
            stop(workers)
    error = next((p.error for p in producers if p.error is not None), None)
    if error is not None:
        raise RuntimeError(f"a producer failed: {error!r}")
    starts.read()
    return {
        "queue": queue.name,
        "settings": queue.settings(),
        "rate": rate,
        "per_transaction": plan.per_transaction,
        "producers": plan.producers,
        "sent": sent,
        "producer_max_lag_s": max(p.worst for p in producers),
        "boundaries": boundaries,
        "samples": samples,
        "phases": phases(samples, starts.seen, boundaries),
        "top_statements": top,
    }


STATEMENTS_SQL = """
SELECT queryid, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query,
       calls, total_exec_time AS ms
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def _statements(conn: psycopg.Connection[Any]) -> dict[int, dict[str, Any]]:
    return {row["queryid"]: dict(row) for row in conn.execute(STATEMENTS_SQL.encode())}


def _top_statements(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], count: int = 8
) -> list[dict[str, Any]]:
    """The statements that took the most server time in a phase (for the notes)."""
    spent = []
    for queryid, row in after.items():
        old = before.get(queryid, {"calls": 0, "ms": 0.0})
        calls, ms = row["calls"] - old["calls"], row["ms"] - old["ms"]
        if calls:
            spent.append({"query": row["query"], "calls": calls, "ms": ms, "mean_ms": ms / calls})
    return sorted(spent, key=lambda r: -r["ms"])[:count]


def _check(workers: list[Any], producers: list[Producer]) -> None:
    failure = crashed(workers) or next(
        (repr(p.error) for p in producers if p.error is not None), None
    )
    if failure:
        raise RuntimeError(failure)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    calls = after["claim_calls"] - before["claim_calls"]
    cpu = (
        None
        if after["server_cpu_s"] is None
        else round(after["server_cpu_s"] - before["server_cpu_s"], 3)
    )
    outcomes = after["outcome_calls"] - before["outcome_calls"]
    return {
        "claims": calls,
        "claim_mean_ms": (after["claim_ms"] - before["claim_ms"]) / calls if calls else None,
        "outcomes": outcomes,
        "outcome_mean_ms": (
            (after["outcome_ms"] - before["outcome_ms"]) / outcomes if outcomes else None
        ),
        "server_cpu_delta_s": cpu,
        "worker_cpu_delta_s": round(after["worker_cpu_s"] - before["worker_cpu_s"], 3),
    }


def phases(
    samples: list[dict[str, Any]], seen: list[tuple[float, float]], bounds: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Each phase's figures: latency of the jobs enqueued in it (and in its last
    third), claim time, backlog, size, dead tuples, autovacuum runs, CPU."""
    out: dict[str, dict[str, Any]] = {}
    edges = [bounds[p] for p in PHASES] + [bounds["end"]]
    for i, phase in enumerate(PHASES):
        start, end = edges[i], edges[i + 1]
        mine = [s for s in samples if s["phase"] == phase]
        if not mine:
            continue
        delays = [(b - a) * 1000 for a, b in seen if start <= a < end]
        tail_from = end - (end - start) / 3
        tail = [(b - a) * 1000 for a, b in seen if tail_from <= a < end]
        calls = sum(s["claims"] for s in mine)
        claim_ms = sum((s["claim_mean_ms"] or 0) * s["claims"] for s in mine)
        outcomes = sum(s["outcomes"] for s in mine)
        outcome_ms = sum((s["outcome_mean_ms"] or 0) * s["outcomes"] for s in mine)
        jobs = len(delays)
        server_cpu = sum(s["server_cpu_delta_s"] or 0 for s in mine)
        worker_cpu = sum(s["worker_cpu_delta_s"] for s in mine)
        first = samples.index(mine[0])
        before = samples[first - 1] if first else mine[0]
        out[phase] = {
            "seconds": round(end - start, 1),
            "jobs": jobs,
            "p50_ms": percentile(delays, 0.5) if delays else None,
            "p99_ms": percentile(delays, 0.99) if delays else None,
            "max_ms": max(delays) if delays else None,
            "last_third_p99_ms": percentile(tail, 0.99) if tail else None,
            "claims": calls,
            "claims_per_s": calls / max(end - start, 1e-9),
            "claim_mean_ms": claim_ms / calls if calls else None,
            "claim_last_mean_ms": mine[-1]["claim_mean_ms"],
            "outcome_mean_ms": outcome_ms / outcomes if outcomes else None,
            "outcome_last_mean_ms": mine[-1]["outcome_mean_ms"],
            "backlog_max": max(s["backlog"] for s in mine),
            "backlog_end": mine[-1]["backlog"],
            "total_mb_end": mine[-1]["total_bytes"] / 2**20,
            "total_mb_max": max(s["total_bytes"] for s in mine) / 2**20,
            "table_mb_end": mine[-1]["table_bytes"] / 2**20,
            "index_mb_end": mine[-1]["index_bytes"] / 2**20,
            "other_mb_end": mine[-1]["other_bytes"] / 2**20,
            "dead_tuples_max": max(s["n_dead_tup"] for s in mine),
            "dead_tuples_end": mine[-1]["n_dead_tup"],
            "autovacuums": mine[-1]["autovacuum_count"] - before["autovacuum_count"],
            "server_cpu_s_per_1000": 1000 * server_cpu / jobs if jobs else None,
            "worker_cpu_s_per_1000": 1000 * worker_cpu / jobs if jobs else None,
        }
    steady = out.get("steady", {}).get("total_mb_end")
    released = [s for s in samples if s["phase"] == "released"]
    if steady and released:
        back = next((s for s in released if s["total_bytes"] / 2**20 <= 1.5 * steady), None)
        out["released"]["back_within_1_5x_after_s"] = (
            None if back is None else round(back["wall"] - bounds["released"], 1)
        )
    return out


# -- report ------------------------------------------------------------------------
ROWS: list[tuple[str, str, int]] = [
    ("jobs enqueued in the phase", "jobs", 0),
    ("enqueue-to-start p50 (ms)", "p50_ms", 1),
    ("enqueue-to-start p99 (ms)", "p99_ms", 1),
    ("  p99 of the phase's last third (ms)", "last_third_p99_ms", 1),
    ("enqueue-to-start max (ms)", "max_ms", 0),
    ("claim statements per second", "claims_per_s", 0),
    ("claim statement mean (ms)", "claim_mean_ms", 2),
    ("  in the phase's last sample (ms)", "claim_last_mean_ms", 2),
    ("outcome statement mean (ms)", "outcome_mean_ms", 2),
    ("  in the phase's last sample (ms)", "outcome_last_mean_ms", 2),
    ("backlog, most (jobs)", "backlog_max", 0),
    ("backlog at the end (jobs)", "backlog_end", 0),
    ("hot table + indexes at the end (MB)", "total_mb_end", 1),
    ("  table (MB)", "table_mb_end", 1),
    ("  indexes (MB)", "index_mb_end", 1),
    ("archive / log table at the end (MB)", "other_mb_end", 1),
    ("dead tuples, most", "dead_tuples_max", 0),
    ("autovacuum runs in the phase", "autovacuums", 0),
    ("server CPU s per 1,000 jobs", "server_cpu_s_per_1000", 3),
    ("worker CPU s per 1,000 jobs", "worker_cpu_s_per_1000", 3),
]


def _n(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(runs: list[dict[str, Any]]) -> str:
    names = [r["queue"] for r in runs]
    lines = [
        "| measure | phase | " + " | ".join(names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]
    for label, key, digits in ROWS:
        for phase in PHASES:
            cells = [_n(r["phases"].get(phase, {}).get(key), digits) for r in runs]
            lines.append(f"| {label} | {phase} | " + " | ".join(cells) + " |")
    cells = [_n(r["phases"].get("released", {}).get("back_within_1_5x_after_s"), 0) for r in runs]
    lines.append(
        "| size back within 1.5x of steady after (s) | released | " + " | ".join(cells) + " |"
    )
    lines.append("")
    for r in runs:
        lines.append(
            f"- {r['queue']}: {r['settings']}; {r['rate']:,.0f} jobs/s enqueued "
            f"{r['per_transaction']} per transaction by {r['producers']} connections, "
            f"{r['sent']:,} in all, producers at most "
            f"{r['producer_max_lag_s']:.2f} s behind their timetable"
            + (
                " (THE LOAD WAS NOT HELD: read the phases' job counts as the rate)"
                if r["producer_max_lag_s"] > 1
                else ""
            )
        )
    return "\n".join(lines)


def goals(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rota's goals under churn, for every Rota setup, against pgqueuer in the same run."""
    peer = next((r for r in runs if r["queue"].startswith("pgqueuer")), None)
    rows = []
    for run in runs:
        if not run["queue"].startswith("rota"):
            continue
        ph = run["phases"]
        steady_p99 = ph.get("steady", {}).get("p99_ms")
        held_p99 = ph.get("held", {}).get("p99_ms")
        peer_held = peer["phases"].get("held", {}).get("p99_ms") if peer else None
        back = ph.get("released", {}).get("back_within_1_5x_after_s")
        ratio = held_p99 / steady_p99 if held_p99 and steady_p99 else None
        rows += [
            {
                "queue": run["queue"],
                "goal": "held p99 / own steady p99",
                "value": ratio,
                "target": "<= 2",
                "met": None if ratio is None else ratio <= 2,
            },
            {
                "queue": run["queue"],
                "goal": "held p99 / pgqueuer's held p99",
                "value": held_p99 / peer_held if held_p99 and peer_held else None,
                "target": "< 1",
                "met": None if not (held_p99 and peer_held) else held_p99 < peer_held,
            },
            {
                "queue": run["queue"],
                "goal": "size back within 1.5x of steady after release (s)",
                "value": back,
                "target": "<= 120",
                "met": back is not None and back <= 120,
            },
        ]
    return rows


def goals_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| queue | goal | value | target | met |", "|---|---|---:|---|:---:|"]
    for r in rows:
        met = {True: "yes", False: "no", None: "-"}[r["met"]]
        lines.append(
            f"| {r['queue']} | {r['goal']} | {_n(r['value'], 2)} | {r['target']} | {met} |"
        )
    return "\n".join(lines)


def capacity(
    new_database: Callable[[str], str], plan: Plan, server: Server | None
) -> dict[str, float]:
    """Each queue's drain rate with 2 processes on an empty table (jobs/s)."""
    found = {}
    for setup in plan.rota_setups:
        dsn = rota_bench.fresh(new_database, "rota_capacity")
        if ROTA_SETUP_SQL[setup]:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(ROTA_SETUP_SQL[setup].encode())
        found[RotaQueue(dsn, plan, setup).name] = rota_bench.drain(
            new_database, plan.capacity_jobs, 2, plan.concurrency, server, dsn
        ).rate
    for name in plan.peers:
        peer = (PgQueuerUvloop if name == "pgqueuer-uvloop" else PgQueuer)(
            new_database(f"{name}_capacity"), batch_size=plan.batch_size
        )
        found[name] = peer.drain(plan.capacity_jobs, 2, server).rate
    return found


def measure(
    new_database: Callable[[str], str], plan: Plan, server: Server | None, say: Any
) -> dict[str, Any]:
    installed = available()
    peers = tuple(p for p in plan.peers if installed.get(p))
    for name in set(plan.peers) - set(peers):
        say(f"{name} is not installed; skipped")
    plan = dataclasses.replace(plan, peers=peers)
    capacities: dict[str, float] = {}
    rate = plan.rate
    if rate is None:
        say(f"drain capacity, 2 processes, {plan.capacity_jobs:,} jobs each")
        capacities = capacity(new_database, plan, server)
        rate = round(min(capacities.values()) / 2)
        if plan.max_rate is not None:
            rate = min(rate, plan.max_rate)
        say(f"capacities {capacities}; load {rate} jobs/s")
    queues: list[Queue] = [
        RotaQueue(new_database("rota_churn"), plan, setup) for setup in plan.rota_setups
    ]
    queues += [
        PgQueuerQueue(new_database(f"{name}_churn".replace("-", "_")), plan, "uvloop" in name)
        for name in peers
    ]
    runs = [churn(q, server, plan, rate, say) for q in queues]
    return {"capacities": capacities, "rate": rate, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.churn",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny durations (smoke test)")
    parser.add_argument("--scale", type=float, default=1.0, help="every phase's length times this")
    parser.add_argument("--rate", type=float, help="jobs enqueued per second (default: measured)")
    parser.add_argument(
        "--rota-setup",
        action="append",
        choices=sorted(ROTA_SETUPS),
        help="a Rota schema variant to run (repeat for several; default: current)",
    )
    parser.add_argument(
        "--per-transaction", type=int, default=1, help="jobs per enqueue transaction (1)"
    )
    parser.add_argument("--producers", type=int, help="enqueueing connections (4)")
    parser.add_argument("--only-rota", action="store_true")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if (
        args.scale <= 0
        or args.per_transaction <= 0
        or (args.rate is not None and args.rate <= 0)
        or (args.producers is not None and args.producers <= 0)
    ):
        parser.error("--scale, --rate, --per-transaction and --producers must be positive")
    plan = Plan.quick() if args.quick else Plan().scaled(args.scale)
    plan = dataclasses.replace(plan, per_transaction=args.per_transaction)
    if args.producers is not None:
        plan = dataclasses.replace(plan, producers=args.producers)
    if args.rate is not None:
        plan = dataclasses.replace(plan, rate=args.rate)
    if args.rota_setup:
        plan = dataclasses.replace(plan, rota_setups=tuple(dict.fromkeys(args.rota_setup)))
    if args.only_rota:
        plan = dataclasses.replace(plan, peers=())
    logging.basicConfig(level=logging.WARNING)

    from rota.testing import EmbeddedPostgres

    say = lambda text: print(f"... {text}", file=sys.stderr, flush=True)  # noqa: E731
    began = time.perf_counter()
    names = itertools.count()
    pg = EmbeddedPostgres(durable=True)
    with open(pg.data / "postgresql.conf", "a") as conf:
        conf.write("shared_preload_libraries = 'pg_stat_statements'\n")
    with pg:
        server = Server(pg.data, pg.url())
        try:
            version = server.version()
            result = measure(
                lambda name: pg.create_database(f"{name}_{next(names)}"), plan, server, say
            )
        finally:
            server.close()
    load = os.getloadavg()
    about = {
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "postgres": version,
        "load_average_at_end": list(load),
        "seconds": round(time.perf_counter() - began),
    }
    result["goals"] = goals(result["runs"])
    print(
        f"\n{about['machine']}, {about['cores']} cores, Python {about['python']}, "
        f"PostgreSQL {version} (durable), load average "
        f"{' '.join(f'{x:.1f}' for x in load)} at the end, {about['seconds']} s in all; "
        f"phases {plan.steady:g} s steady, {plan.held:g} s held, {plan.released:g} s released; "
        f"load {result['rate']:,.0f} jobs/s"
        + (
            " (half the lower of the drain capacities: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in result["capacities"].items())
            + " jobs/s)"
            if result["capacities"]
            else ""
        )
        + "\n"
    )
    print(table(result["runs"]))
    print()
    print(goals_table(result["goals"]))
    if args.json:
        result["about"] = about
        result["plan"] = dataclasses.asdict(plan)
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
