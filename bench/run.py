"""`make bench`: Rota beside Graphile Worker and pgqueuer on one PostgreSQL.

Starts a throwaway PostgreSQL server with its default durability (fsync and
synchronous_commit on), gives every measurement a fresh database on it, and
prints two tables: every measure for every queue, then Rota against the goals
of issue 48, each ratio taken to the best setup of the peer it names
(Graphile Worker with its perfTest settings or at concurrency 10; pgqueuer on
uvloop, or on asyncio when asked). Drains and latencies are repeated in
rounds, the queues taking turns within each round, so that all of them see
the same machine; a cell shows the median of the rounds and, in brackets, the
lowest and highest. The peers are measured only when they are installed
(`make bench` installs them; Graphile Worker needs node and npm);
`--only-rota` skips them, and `--peers` names others, e.g.
`--peers pgqueuer,pgqueuer-uvloop,procrastinate,graphile-worker`.

    python -m bench.run [--rounds 2] [--jobs 20000] [--quick] [--json results.json]
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
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import rota_bench
from bench.measure import Drain, Latency, vacuum
from bench.peers import (
    GRAPHILE_SETUPS,
    GraphileWorker,
    GraphileWorkerC10,
    Peer,
    PgQueuer,
    PgQueuerUvloop,
    Procrastinate,
    available,
)
from bench.server import Server
from rota.migrate import KEY_INDEXES

NewDatabase = Callable[[str], str]
PGQUEUER_SETUPS = ("pgqueuer", "pgqueuer-uvloop")
CHURN_RESULTS = os.path.join("bench", "results", "churn.json")
"""Where `make bench-churn` leaves its results: the churn goal is read from there."""


@dataclasses.dataclass(frozen=True)
class Plan:
    jobs: int = 20_000
    """Jobs per drain."""
    single_jobs: int = 2_000
    latency_jobs: int = 200
    gap: float = 0.015
    concurrency: int = 500
    """Rota's best setup for a drain of no-op async jobs, as Graphile Worker's
    perfTest holds up to 500 jobs at once (its local queue): a worker claims as
    many jobs as it has free slots and writes up to 500 outcomes at once, and
    claims and outcomes of 500 cost the server less per job than batches of 100
    (docs/benchmarks.md, "A fifth run")."""
    rounds: int = 2
    """Two keep `make bench` near nine minutes on the loaded 2-core machine (four queue
    setups); more narrow the spread."""
    done_rows: int = 2_000_000
    procrastinate_jobs: int = 4_000
    """procrastinate fetches and finishes one job per transaction: a smaller drain
    tells the same story in a fraction of the time (measured in the first round only)."""
    peers: tuple[str, ...] = ("pgqueuer-uvloop", *GRAPHILE_SETUPS)
    """pgqueuer on asyncio's own loop (slower than on uvloop in every run) and
    procrastinate are left out by default to keep the run short (`--peers` takes
    them): procrastinate finishes one job per transaction, drains 20-100 times
    slower than pgqueuer, and its drain alone took more than a minute of the run."""

    @classmethod
    def quick(cls, **changes: Any) -> Plan:
        """Tiny counts for a smoke test: every field, no meaningful number."""
        base = cls(
            jobs=1_000,
            single_jobs=50,
            latency_jobs=10,
            gap=0.01,
            rounds=1,
            done_rows=20_000,
            procrastinate_jobs=200,
        )
        return dataclasses.replace(base, **changes)


PEERS: dict[str, type[Peer]] = {
    "pgqueuer": PgQueuer,
    "pgqueuer-uvloop": PgQueuerUvloop,
    "procrastinate": Procrastinate,
    "graphile-worker": GraphileWorker,
    "graphile-worker-c10": GraphileWorkerC10,
}

Results = dict[str, dict[str, list[Any]]]
"""Queue -> measure -> one value per round (a float, a Drain or a Latency)."""


def measure(
    new_database: NewDatabase,
    plan: Plan,
    server: Server | None = None,
    say: Callable[[str], None] = print,
) -> Results:
    """Every measurement of the plan, by queue and measure."""
    installed = available()
    peers = []
    for name in plan.peers:
        if installed.get(name):
            peers.append(name)
        else:
            hint = " (needs node and npm; make bench installs it)" if "graphile" in name else ""
            say(f"{name} is not installed{hint}; skipped")
    results: Results = {name: {} for name in ["rota", *peers]}
    made: list[str] = []
    create = new_database

    def add(queue: str, key: str, value: Any) -> None:
        results[queue].setdefault(key, []).append(value)

    def made_database(name: str) -> str:
        dsn = create(name)
        made.append(dsn)
        return dsn

    def tidied(measurement: Callable[..., Any], *args: Any) -> Any:
        """`measurement(*args)`, then VACUUM ANALYZE the databases it made
        (timed_drain does its own, measured)."""
        before = len(made)
        value = measurement(*args)
        for dsn in made[before:]:
            vacuum(dsn)
        return value

    # The server's CPU is read server-wide, so a database left with work for
    # autovacuum (dead rows, or statistics to take after its changes) would have
    # it done in whichever measurement is running when the launcher comes by,
    # another queue's drain as likely as its own. Every database is left with
    # none: an enqueue's and a latency round's are vacuumed and analyzed after
    # them, a drain's by timed_drain (and that cost measured).
    new_database = made_database
    say("rota: enqueue")
    single_dsn = rota_bench.fresh(new_database, "rota_single")
    add("rota", "single", rota_bench.enqueue_single(single_dsn, plan.single_jobs))
    batch_dsn = rota_bench.fresh(new_database, "rota_batch")
    add("rota", "batch", rota_bench.enqueue_batches(batch_dsn, plan.jobs))
    for name in peers:
        say(f"{name}: enqueue")
        single = PEERS[name](new_database(f"{name}_single"))
        asyncio.run(single.install())
        add(name, "single", single.enqueue_rate(plan.single_jobs, one_by_one=True))
        batch = PEERS[name](new_database(f"{name}_batch"))
        asyncio.run(batch.install())
        add(name, "batch", batch.enqueue_rate(plan.jobs, one_by_one=False))
    for dsn in made:  # the enqueues' databases, every one made so far
        vacuum(dsn)

    say(f"rota: {plan.done_rows:,} done rows")
    began = time.perf_counter()
    crowded = rota_bench.with_done_rows(new_database, plan.done_rows)
    say(
        f"rota: {plan.done_rows:,} done rows inserted and vacuumed "
        f"in {time.perf_counter() - began:.0f} s"
    )
    # Its control: an empty table drained in every round just as the crowded one
    # is. A table drained again after a vacuum writes more full-page images than a
    # fresh one (its jobs land in the room the last drain left, across more pages),
    # so only this comparison isolates what the done rows cost.
    reused = rota_bench.fresh(new_database, "rota_reused")

    rotating = [q for q in ["rota", *peers] if q != "procrastinate"]
    for round_ in range(plan.rounds):
        # Each round starts with another queue, so no queue always goes first.
        shift = round_ % len(rotating)
        for queue in rotating[shift:] + rotating[:shift]:
            for processes in (1, 2):
                # Rota's drain under a limit and without one take turns at going
                # first, so that neither always runs in what the other left.
                variants = ["", "_limited"] if queue == "rota" else [""]
                for variant in variants[:: 1 if round_ % 2 == 0 else -1]:
                    if variant:
                        say(
                            f"round {round_ + 1}: rota drain with {processes} process(es)"
                            f" under a concurrency limit of {NON_BINDING_LIMIT:,}"
                        )
                        drained = rota_bench.drain(
                            new_database,
                            plan.jobs,
                            processes,
                            plan.concurrency,
                            server,
                            limit=NON_BINDING_LIMIT,
                        )
                    else:
                        say(f"round {round_ + 1}: {queue} drain with {processes} process(es)")
                        drained = _drain(queue, new_database, plan, processes, server)
                    add(queue, f"drain{processes}{variant}", drained)
            say(f"round {round_ + 1}: {queue} enqueue-to-start latency")
            add(queue, "latency", tidied(_latency, queue, new_database, plan))
            if queue == "rota":
                tables = [
                    ("done", crowded, f"beside {plan.done_rows:,} done rows"),
                    ("reused", reused, "on an empty table drained every round"),
                ]
                for variant, dsn, where in tables[:: 1 if round_ % 2 == 0 else -1]:
                    for processes in (1, 2):
                        say(f"round {round_ + 1}: rota drain, {processes} process(es), {where}")
                        add(
                            "rota",
                            f"drain{processes}_{variant}",
                            rota_bench.drain(
                                new_database, plan.jobs, processes, plan.concurrency, server, dsn
                            ),
                        )
        if round_ == 0 and "procrastinate" in peers:
            for processes in (1, 2):
                say(
                    f"procrastinate: drain of {plan.procrastinate_jobs:,} "
                    f"with {processes} process(es)"
                )
                peer = Procrastinate(new_database(f"procrastinate_drain_{processes}"))
                add(
                    "procrastinate",
                    f"drain{processes}",
                    peer.drain(plan.procrastinate_jobs, processes, server),
                )
            say("procrastinate: enqueue-to-start latency")
            add("procrastinate", "latency", tidied(_latency, "procrastinate", new_database, plan))
    return results


NON_BINDING_LIMIT = 1_000_000
"""A concurrency limit no drain reaches: what the limited claim costs when it
holds nothing back."""


def _drain(
    queue: str, new_database: NewDatabase, plan: Plan, processes: int, server: Server | None
) -> Drain:
    if queue == "rota":
        return rota_bench.drain(new_database, plan.jobs, processes, plan.concurrency, server)
    peer = PEERS[queue](new_database(f"{queue}_drain_{processes}"))
    return peer.drain(plan.jobs, processes, server)


def _latency(queue: str, new_database: NewDatabase, plan: Plan) -> Latency:
    if queue == "rota":
        return rota_bench.latency(new_database, plan.latency_jobs, plan.gap)
    return PEERS[queue](new_database(f"{queue}_latency")).latency(plan.latency_jobs, plan.gap)


# -- summarising ------------------------------------------------------------
Extract = Callable[[dict[str, list[Any]]], list[float]]


def _field(key: str, attr: str) -> Extract:
    def values(found: dict[str, list[Any]]) -> list[float]:
        out = []
        for item in found.get(key, []):
            value = item if attr == "" else getattr(item, attr)
            if value is not None:
                out.append(float(value))
        return out

    return values


def _total_cpu(key: str) -> Extract:
    """Per round: the server's and the workers' CPU seconds per 1,000 jobs, added."""

    def values(found: dict[str, list[Any]]) -> list[float]:
        out = []
        for drain in found.get(key, []):
            server, worker = drain.cpu_seconds_per_1000_jobs, drain.worker_cpu_seconds_per_1000_jobs
            if server is not None and worker is not None:
                out.append(server + worker)
        return out

    return values


def _cores_busy(key: str) -> Extract:
    """Per round: the cores the drain kept busy (server and workers): its rate times its
    total CPU per job."""

    def values(found: dict[str, list[Any]]) -> list[float]:
        totals = _total_cpu(key)(found)
        return [d.rate * t / 1000 for d, t in zip(found.get(key, []), totals, strict=False)]

    return values


def _ceiling(key: str) -> Extract:
    """Per round: the fastest drain this machine's cores allow at the round's total CPU
    per job, were they all busy with it and nothing else (jobs/s)."""

    def values(found: dict[str, list[Any]]) -> list[float]:
        cores = os.cpu_count() or 1
        return [cores * 1000 / t for t in _total_cpu(key)(found) if t > 0]

    return values


def _processes(count: int) -> str:
    return f"{count} process" + ("es" if count > 1 else "")


def _drain_ratio(processes: int, variant: str, over: str = "") -> Extract:
    """Per round: a variant of the drain (beside the done rows, under a limit) over
    the plain drain on a fresh empty table, or over another variant (`over`)."""

    def values(found: dict[str, list[Any]]) -> list[float]:
        plain = found.get(f"drain{processes}" + (f"_{over}" if over else ""), [])
        other = found.get(f"drain{processes}_{variant}", [])
        return [o.rate / p.rate for p, o in zip(plain, other, strict=False)]

    return values


@dataclasses.dataclass(frozen=True)
class Metric:
    key: str
    label: str
    values: Extract
    higher_is_better: bool
    digits: int = 0


METRICS = [
    Metric("enqueue_single", "enqueue, one per transaction (jobs/s)", _field("single", ""), True),
    Metric("enqueue_batch", "enqueue, batches of 1,000 (jobs/s)", _field("batch", ""), True),
    Metric("drain1", "drain no-op jobs, 1 process (jobs/s)", _field("drain1", "rate"), True),
    Metric("drain2", "drain no-op jobs, 2 processes (jobs/s)", _field("drain2", "rate"), True),
    Metric(
        "cpu1",
        "server CPU s per 1,000 jobs, 1 process",
        _field("drain1", "cpu_seconds_per_1000_jobs"),
        False,
        3,
    ),
    Metric(
        "cpu2",
        "server CPU s per 1,000 jobs, 2 processes",
        _field("drain2", "cpu_seconds_per_1000_jobs"),
        False,
        3,
    ),
    Metric(
        "worker_cpu1",
        "worker CPU s per 1,000 jobs, 1 process",
        _field("drain1", "worker_cpu_seconds_per_1000_jobs"),
        False,
        3,
    ),
    Metric(
        "worker_cpu2",
        "worker CPU s per 1,000 jobs, 2 processes",
        _field("drain2", "worker_cpu_seconds_per_1000_jobs"),
        False,
        3,
    ),
    Metric("total_cpu1", "total CPU s per 1,000 jobs, 1 process", _total_cpu("drain1"), False, 3),
    Metric("total_cpu2", "total CPU s per 1,000 jobs, 2 processes", _total_cpu("drain2"), False, 3),
    Metric(
        "cores1",
        "  cores busy (rate x total CPU per job), 1 process",
        _cores_busy("drain1"),
        False,
        2,
    ),
    Metric(
        "cores2",
        "  cores busy (rate x total CPU per job), 2 processes",
        _cores_busy("drain2"),
        False,
        2,
    ),
    Metric(
        "ceiling1",
        "  the cores' ceiling at that CPU per job, 1 process (jobs/s)",
        _ceiling("drain1"),
        True,
    ),
    Metric(
        "ceiling2",
        "  the cores' ceiling at that CPU per job, 2 processes (jobs/s)",
        _ceiling("drain2"),
        True,
    ),
    Metric("wal1", "WAL bytes per job, 1 process", _field("drain1", "wal_bytes_per_job"), False),
    Metric("wal2", "WAL bytes per job, 2 processes", _field("drain2", "wal_bytes_per_job"), False),
    Metric(
        "cpu_all1",
        "server CPU s per 1,000 jobs, enqueue + drain, 1 process",
        _field("drain1", "cpu_with_enqueue_per_1000_jobs"),
        False,
        3,
    ),
    Metric(
        "cpu_all2",
        "server CPU s per 1,000 jobs, enqueue + drain, 2 processes",
        _field("drain2", "cpu_with_enqueue_per_1000_jobs"),
        False,
        3,
    ),
    Metric(
        "wal_all1",
        "WAL bytes per job, enqueue + drain, 1 process",
        _field("drain1", "wal_with_enqueue_per_job"),
        False,
    ),
    Metric(
        "wal_all2",
        "WAL bytes per job, enqueue + drain, 2 processes",
        _field("drain2", "wal_with_enqueue_per_job"),
        False,
    ),
    Metric(
        "history1",
        "history rows per job after the drain (done rows kept), 1 process",
        _field("drain1", "history_rows_per_job"),
        True,
        3,
    ),
    Metric(
        "history2",
        "history rows per job after the drain (done rows kept), 2 processes",
        _field("drain2", "history_rows_per_job"),
        True,
        3,
    ),
    Metric(
        "watch_cpu1",
        "  the harness's watching connection, left out of the drain's: CPU s per 1,000 jobs,"
        " 1 process",
        _field("drain1", "watch_cpu_seconds_per_1000_jobs"),
        False,
        4,
    ),
    Metric(
        "watch_cpu2",
        "  the harness's watching connection, left out of the drain's: CPU s per 1,000 jobs,"
        " 2 processes",
        _field("drain2", "watch_cpu_seconds_per_1000_jobs"),
        False,
        4,
    ),
    Metric(
        "vacuum_cpu1",
        "  VACUUM ANALYZE after the drain: server CPU s per 1,000 jobs, 1 process",
        _field("drain1", "vacuum_cpu_seconds_per_1000_jobs"),
        False,
        3,
    ),
    Metric(
        "vacuum_cpu2",
        "  VACUUM ANALYZE after the drain: server CPU s per 1,000 jobs, 2 processes",
        _field("drain2", "vacuum_cpu_seconds_per_1000_jobs"),
        False,
        3,
    ),
    Metric(
        "vacuum_wal1",
        "  VACUUM ANALYZE after the drain: WAL bytes per job, 1 process",
        _field("drain1", "vacuum_wal_bytes_per_job"),
        False,
    ),
    Metric(
        "vacuum_wal2",
        "  VACUUM ANALYZE after the drain: WAL bytes per job, 2 processes",
        _field("drain2", "vacuum_wal_bytes_per_job"),
        False,
    ),
    Metric("commits1", "commits per job, 1 process", _field("drain1", "commits_per_job"), False, 4),
    Metric(
        "commits2", "commits per job, 2 processes", _field("drain2", "commits_per_job"), False, 4
    ),
    Metric("p50", "enqueue-to-start p50 (ms)", _field("latency", "p50_ms"), False, 1),
    Metric("p99", "enqueue-to-start p99 (ms)", _field("latency", "p99_ms"), False, 1),
    Metric(
        "enqueue_call_p50",
        "  the enqueue call (its commit) alone, p50 (ms)",
        _field("latency", "enqueue_p50_ms"),
        False,
        2,
    ),
    Metric(
        "after_return_p50",
        "  from the enqueue call's return to the start, p50 (ms)",
        _field("latency", "after_return_p50_ms"),
        False,
        2,
    ),
    Metric(
        "drain1_done",
        "drain beside the done rows, 1 process (jobs/s)",
        _field("drain1_done", "rate"),
        True,
    ),
    Metric(
        "drain2_done",
        "drain beside the done rows, 2 processes (jobs/s)",
        _field("drain2_done", "rate"),
        True,
    ),
    Metric(
        "done_ratio1",
        "  the same over the empty-table drain, 1 process",
        _drain_ratio(1, "done"),
        True,
        2,
    ),
    Metric(
        "done_ratio2",
        "  the same over the empty-table drain, 2 processes",
        _drain_ratio(2, "done"),
        True,
        2,
    ),
]
METRICS += [
    Metric(
        f"drain{processes}_reused",
        f"drain on an empty table drained every round as well, {_processes(processes)} (jobs/s)",
        _field(f"drain{processes}_reused", "rate"),
        True,
    )
    for processes in (1, 2)
] + [
    Metric(
        f"done_like{processes}",
        f"  the drain beside the done rows over it, {_processes(processes)}",
        _drain_ratio(processes, "done", over="reused"),
        True,
        2,
    )
    for processes in (1, 2)
]
METRICS += [
    Metric(
        f"drain{processes}_limited",
        f"drain under a non-binding concurrency limit, {_processes(processes)} (jobs/s)",
        _field(f"drain{processes}_limited", "rate"),
        True,
    )
    for processes in (1, 2)
] + [
    Metric(
        f"limited_ratio{processes}",
        f"  the same over the drain without a limit, {_processes(processes)}",
        _drain_ratio(processes, "limited"),
        True,
        2,
    )
    for processes in (1, 2)
]
BY_KEY = {m.key: m for m in METRICS}


def summary(results: Results) -> dict[str, dict[str, dict[str, Any]]]:
    """Queue -> metric -> median, min, max and every round's value."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for queue, found in results.items():
        out[queue] = {}
        for metric in METRICS:
            values = metric.values(found)
            if values:
                out[queue][metric.key] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "values": values,
                }
    return out


@dataclasses.dataclass(frozen=True)
class Goal:
    label: str
    metric: str
    target: float
    kind: str
    """"ratio>=" / "ratio<=": Rota over the peer's best; "<" / ">=" / "<=": Rota's own
    value; "ratio": a ratio with no target."""
    against: tuple[str, ...] = GRAPHILE_SETUPS
    """The peer setups whose best median Rota is compared with."""


GOALS = [
    Goal("drain, 1 process", "drain1", 1.0, "ratio>="),
    Goal("drain, 2 processes", "drain2", 1.0, "ratio>="),
    Goal("server CPU per job, enqueue + drain, 1 process", "cpu_all1", 1.0, "ratio<="),
    Goal("server CPU per job, enqueue + drain, 2 processes", "cpu_all2", 1.0, "ratio<="),
    Goal("WAL per job, enqueue + drain, 1 process (no goal)", "wal_all1", 0.0, "ratio"),
    Goal("WAL per job, enqueue + drain, 2 processes (no goal)", "wal_all2", 0.0, "ratio"),
    Goal("server CPU per job, drain alone, 2 processes (no goal)", "cpu2", 0.0, "ratio"),
    Goal("every job keeps its history row, 1 process", "history1", 1.0, ">="),
    Goal("every job keeps its history row, 2 processes", "history2", 1.0, ">="),
    Goal("enqueue-to-start p50 (ms)", "p50", 3.0, "<"),
    Goal("enqueue-to-start p99 (ms)", "p99", 10.0, "<"),
    Goal("2M-done drain over empty, 1 process", "done_ratio1", 0.9, ">="),
    Goal("2M-done drain over empty, 2 processes", "done_ratio2", 0.9, ">="),
    Goal("2M-done drain over an empty table drained alike, 1 process", "done_like1", 0.9, ">="),
    Goal("2M-done drain over an empty table drained alike, 2 processes", "done_like2", 0.9, ">="),
    Goal("drain under a non-binding limit over without, 1 process", "limited_ratio1", 0.9, ">="),
    Goal("drain under a non-binding limit over without, 2 processes", "limited_ratio2", 0.9, ">="),
    *(
        Goal(
            f"drain over pgqueuer's best, {_processes(n)} (no goal)",
            f"drain{n}",
            0.0,
            "ratio",
            PGQUEUER_SETUPS,
        )
        for n in (1, 2)
    ),
    Goal(
        "server CPU per job, enqueue + drain, over pgqueuer's best, 2 processes (no goal)",
        "cpu_all2",
        0.0,
        "ratio",
        PGQUEUER_SETUPS,
    ),
]
CHURN_GOAL = "churn: held p99 over steady p99 (the last make bench-churn)"


def _met(kind: str, target: float, rota: float | None, ratio: float | None) -> bool | None:
    if kind == "ratio>=":
        return None if ratio is None else ratio >= target
    if kind == "ratio<=":
        return None if ratio is None else ratio <= target
    if kind == "<":
        return None if rota is None else rota < target
    if kind == ">=":
        return None if rota is None else rota >= target
    if kind == "<=":
        return None if rota is None else rota <= target
    return None


def goals(summed: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each goal with Rota's median, the best median of the peer setups it is
    compared with (and which setup), the ratio."""
    rows = []
    for goal in GOALS:
        metric = BY_KEY[goal.metric]
        rota = summed.get("rota", {}).get(goal.metric, {}).get("median")
        best_setup, best = None, None
        comparing = goal.kind.startswith("ratio")
        for setup in goal.against if comparing else ():
            value = summed.get(setup, {}).get(goal.metric, {}).get("median")
            if value is None:
                continue
            if best is None or (value > best if metric.higher_is_better else value < best):
                best_setup, best = setup, value
        ratio = rota / best if rota is not None and best else None
        rows.append(
            {
                "goal": goal.label,
                "metric": goal.metric,
                "rota": rota,
                "peer_best": best,
                "peer_best_setup": best_setup,
                "ratio": ratio,
                "target": None
                if goal.kind == "ratio"
                else f"{goal.kind.replace('ratio', 'ratio ')} {goal.target}",
                "met": _met(goal.kind, goal.target, rota, ratio),
            }
        )
    rows.append(churn_goal())
    return rows


def churn_goal(path: str = CHURN_RESULTS) -> dict[str, Any]:
    """The churn benchmark's held/steady p99 goal, from its last results (it runs for
    about 15 minutes on its own: `make bench-churn`); unmet-unknown without them."""
    row: dict[str, Any] = {
        "goal": CHURN_GOAL,
        "metric": "churn",
        "rota": None,
        "peer_best": None,
        "peer_best_setup": None,
        "ratio": None,
        "target": "<= 2.0",
        "met": None,
    }
    try:
        with open(path) as found:
            result = json.load(found)
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(os.path.getmtime(path)))
    except (OSError, ValueError):
        row["goal"] += ": none found, run make bench-churn"
        return row
    for entry in result.get("goals", []):
        if entry.get("queue") == "rota" and entry.get("goal") == "held p99 / own steady p99":
            row.update(rota=entry["value"], met=entry["met"])
            row["goal"] += f", {when} UTC"
    return row


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _cell(entry: dict[str, Any] | None, digits: int) -> str:
    if not entry:
        return "-"
    text = _number(entry["median"], digits)
    if len(entry["values"]) > 1:
        text += f" ({_number(entry['min'], digits)}-{_number(entry['max'], digits)})"
    return text


def table(results: Results) -> str:
    """The results as Markdown: every measure, then Rota against the goals."""
    summed = summary(results)
    names = list(results)
    lines = [
        "| measure | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for metric in METRICS:
        cells = [_cell(summed[n].get(metric.key), metric.digits) for n in names]
        if all(c == "-" for c in cells):
            continue
        lines.append(f"| {metric.label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| goal | Rota | peer's best | Rota / peer | target | met |",
        "|---|---:|---:|---:|---|:---:|",
    ]
    for row in goals(summed):
        digits = BY_KEY[row["metric"]].digits if row["metric"] in BY_KEY else 2
        best = _number(row["peer_best"], digits)
        if row["peer_best_setup"]:
            best += f" ({row['peer_best_setup']})"
        met = {True: "yes", False: "no", None: "-"}[row["met"]]
        lines.append(
            f"| {row['goal']} | {_number(row['rota'], digits)} | {best} "
            f"| {_number(row['ratio'], 2)} | {row['target'] or '-'} | {met} |"
        )
    lines.append("")
    for name in names:
        drains = results[name].get("drain1") or results[name].get("drain2")
        if drains:
            lines.append(f"- {name} drain: {drains[0].jobs:,} jobs, {drains[0].settings}")
        if results[name].get("latency"):
            lat = results[name]["latency"][0]
            lines.append(f"- {name} latency: {lat.jobs} jobs, {lat.settings}")
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Drain):
        return {
            **dataclasses.asdict(value),
            "cpu_seconds_per_1000_jobs": value.cpu_seconds_per_1000_jobs,
            "worker_cpu_seconds_per_1000_jobs": value.worker_cpu_seconds_per_1000_jobs,
            "wal_bytes_per_job": value.wal_bytes_per_job,
            "commits_per_job": value.commits_per_job,
        }
    if isinstance(value, Latency):
        return dataclasses.asdict(value)
    return value


def report(results: Results, plan: Plan, about: dict[str, Any]) -> dict[str, Any]:
    summed = summary(results)
    return {
        "about": about,
        "plan": dataclasses.asdict(plan),
        "summary": summed,
        "goals": goals(summed),
        "results": {
            queue: {key: [_jsonable(v) for v in values] for key, values in found.items()}
            for queue, found in results.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    defaults = Plan()
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny counts, one round (smoke test)")
    parser.add_argument(
        "--rounds", type=int, help=f"rounds of drains and latencies ({defaults.rounds})"
    )
    parser.add_argument("--jobs", type=int, help=f"jobs per drain ({defaults.jobs:,})")
    parser.add_argument(
        "--single-jobs", type=int, help=f"one-per-transaction enqueues ({defaults.single_jobs:,})"
    )
    parser.add_argument(
        "--latency-jobs", type=int, help=f"jobs per latency round ({defaults.latency_jobs})"
    )
    parser.add_argument("--gap", type=float, help=f"seconds between latency jobs ({defaults.gap})")
    parser.add_argument(
        "--concurrency", type=int, help=f"Rota worker concurrency ({defaults.concurrency})"
    )
    parser.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every Rota worker, e.g. --worker-arg=--no-claim-ahead",
    )
    parser.add_argument(
        "--key-index",
        choices=KEY_INDEXES,
        default="constraint",
        help="how Rota's databases keep idempotency keys unique (rota migrate --key-index)",
    )
    parser.add_argument(
        "--done-rows", type=int, help=f"done rows beside the crowded drain ({defaults.done_rows:,})"
    )
    parser.add_argument(
        "--peers", help="comma-separated, of " + ",".join(PEERS) + f" ({','.join(defaults.peers)})"
    )
    parser.add_argument("--only-rota", action="store_true")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    changes: dict[str, Any] = {
        field: getattr(args, field)
        for field in (
            "rounds",
            "jobs",
            "single_jobs",
            "latency_jobs",
            "gap",
            "concurrency",
            "done_rows",
        )
        if getattr(args, field) is not None
    }
    if any(v <= 0 for v in changes.values()):
        parser.error("counts, rounds and the gap must be positive")
    if args.peers is not None:
        chosen = tuple(p for p in args.peers.split(",") if p)
        unknown = set(chosen) - set(PEERS)
        if unknown:
            parser.error(f"unknown peers: {', '.join(sorted(unknown))}")
        changes["peers"] = chosen
    if args.only_rota:
        changes["peers"] = ()
    plan = dataclasses.replace(plan, **changes)
    rota_bench.EXTRA_WORKER_ARGS[:] = args.worker_arg
    rota_bench.KEY_INDEX = args.key_index
    logging.basicConfig(level=logging.WARNING)

    from bench.server import postmaster_pid
    from rota.testing import EmbeddedPostgres

    say = lambda text: print(f"... {text}", file=sys.stderr, flush=True)  # noqa: E731
    began = time.perf_counter()
    names = itertools.count()
    with EmbeddedPostgres(durable=True) as pg:
        server = Server(pg.data, pg.url())
        version = server.version()
        assert postmaster_pid(pg.data) == server.postmaster
        try:
            results = measure(
                lambda name: pg.create_database(f"{name}_{next(names)}"), plan, server, say
            )
            round_trips = {idle: server.round_trip_ms(idle, 200) for idle in (0.0, plan.gap)}
        finally:
            server.close()
    load = os.getloadavg()
    about: dict[str, Any] = {
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "postgres": version,
        "load_average_at_end": list(load),
        # What waking an idle backend costs on this machine (see round_trip_ms).
        "select_1_ms": {
            "back_to_back": round_trips[0.0],
            "after_latency_gap": round_trips[plan.gap],
        },
        "seconds": round(time.perf_counter() - began),
    }
    print(
        f"\n{about['machine']}, {about['cores']} cores, Python {about['python']}, "
        f"PostgreSQL {version} (fsync and synchronous_commit on), "
        f"load average {' '.join(f'{x:.1f}' for x in load)} at the end, "
        f"{plan.rounds} round(s) in {about['seconds']} s; a SELECT 1 took "
        f"{round_trips[0.0]:.2f} ms back to back and {round_trips[plan.gap]:.2f} ms "
        f"after {plan.gap * 1000:g} ms idle (the latency rounds' gap)\n"
    )
    print(table(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report(results, plan, about), out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
