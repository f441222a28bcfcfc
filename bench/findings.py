"""`make bench-findings`: the experiments behind bench/FINDINGS.md, reproducible.

1. Plans: the hot statements (claim, heartbeat, outcome) as PostgreSQL plans
   them generically (`EXPLAIN (GENERIC_PLAN)`, PostgreSQL 16+) and as it runs
   them when psycopg prepares them after 5 executions: the executed plan of
   every call (auto_explain into the server log), the time of each call, and
   `pg_prepared_statements`' count of generic and custom plans.
2. `plan_cache_mode=force_custom_plan` for the unchanged worker (through
   PGOPTIONS), against the default, in alternating drains.
3. A raw loop over Rota's own statements: claim, then write the outcomes, in
   two round trips and two commits (serial), or the outcomes of batch N and
   the claim of batch N+1 in one round trip and one commit (psycopg pipeline
   mode), beside the worker and pgqueuer on uvloop in the same run.
4. The floor under enqueue-to-start latency: jobs enqueued one at a time to
   a process that does nothing but wait for the NOTIFY on its claim
   connection, claim with Rota's statement and note the start, beside the
   worker in alternating rounds; and the same with the claim's commit not
   waited for (`synchronous_commit=off`, what the durable claim costs; not a
   setting Rota offers).

    python -m bench.findings [--jobs 20000] [--rounds 2] [--latency-jobs 200] [--json findings.json]
    python -m bench.findings raw-worker DSN --mode serial|pipelined [--custom-plans]
    python -m bench.findings raw-listener DSN [--claim-not-flushed]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from bench import measure, rota_bench
from bench.measure import (
    Drain,
    Latency,
    record_start,
    spawn,
    take_turns,
    timed_drain,
    timed_latency,
)
from bench.peers import PgQueuerUvloop, available
from bench.run import Plan
from bench.server import Server
from rota import sql
from rota.claim import _claim_params

HOT = ("claim_jobs", "extend_leases", "write_outcomes")
NewDatabase = Callable[[str], str]


# -- 1. plans ------------------------------------------------------------------
def positional(text: str) -> tuple[str, list[str]]:
    """A psycopg query with %(name)s placeholders as $1, $2... and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match[1]
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text), names


def _running(conn: psycopg.Connection[Any], worker: str, limit: int) -> list[tuple[int, int]]:
    """Claim `limit` jobs as `worker` with the worker's own claim; the key (id, claim
    number) of each."""
    rows = conn.execute(
        sql.query("claim_jobs"),
        _claim_params(worker, limit, 300, None, None),
    ).fetchall()
    conn.commit()
    return [(r[0], r[-1]) for r in rows]  # id and claims: the first column and the last


def _finish_params(held: list[tuple[int, int]], worker: str) -> dict[str, Any]:
    return {
        "ids": [i for i, _ in held],
        "claims": [a for _, a in held],
        "outcomes": ["done"] * len(held),
        "delays": [0.0] * len(held),
        "errors": [None] * len(held),
        "results": None,
        "worker": worker,
        "now": None,
    }


def _explain_generic(conn: psycopg.Connection[Any], name: str) -> str:
    text, _ = positional(sql.query(name))
    rows = conn.execute(f"EXPLAIN (GENERIC_PLAN, COSTS ON) {text}".encode()).fetchall()
    conn.rollback()
    return "\n".join(r[0] for r in rows)


def _explain_analyze(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any], mode: str
) -> tuple[str, float]:
    """The plan PostgreSQL runs for a prepared `name` under plan_cache_mode `mode`, rolled back."""
    text, names = positional(sql.query(name))
    conn.execute(f"SET plan_cache_mode = {mode}".encode())
    conn.execute(f"PREPARE probe AS {text}".encode())
    # EXECUTE cannot infer the types of bound parameters: send the values as literals.
    args = ", ".join(pgsql.Literal(params[n]).as_string(conn) for n in names)
    rows = conn.execute(
        f"EXPLAIN (ANALYZE, COSTS ON, TIMING ON) EXECUTE probe({args})".encode()
    ).fetchall()
    conn.rollback()
    conn.execute(b"DEALLOCATE ALL")
    conn.execute(b"RESET plan_cache_mode")
    conn.commit()
    plan = "\n".join(r[0] for r in rows)
    found = re.search(r"Execution Time: ([\d.]+) ms", plan)
    return plan, float(found[1]) if found else float("nan")


RESET = {
    # Put the rows back as they were before the call, so every call sees the same table.
    "claim_jobs": "UPDATE rota.job SET status = 'ready', attempts = attempts - 1, locked_by = NULL,"
    " locked_until = NULL, started_at = NULL WHERE id = ANY(%(ids)s)",
    "write_outcomes": "UPDATE rota.job SET status = 'running', finished_at = NULL,"
    " locked_until = now() + interval '5 minutes' WHERE id = ANY(%(ids)s)",
}


def marked(name: str) -> str:
    """The statement with a comment that names it in the server log."""
    return f"/* bench:{name} */ {sql.query(name)}"


def _calls(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any], calls: int
) -> list[float]:
    """Run `name` `calls` times the way the worker does: autocommit, and psycopg
    prepares it after 5 executions (a ROLLBACK would make psycopg forget what it
    prepared, so each call commits and the rows are put back by another
    statement); milliseconds per call, seen from the client."""
    took = []
    for _ in range(calls):
        began = time.perf_counter()
        rows = conn.execute(marked(name).encode(), params).fetchall()
        took.append(1000 * (time.perf_counter() - began))
        if name in RESET:
            conn.execute(RESET[name].encode(), {"ids": [r[0] for r in rows]}, prepare=False)
    return took


def plans(
    new_database: NewDatabase, log_path: Path, ready: int, done: int, held: int
) -> dict[str, Any]:
    """The hot statements' plans on a table with `ready` ready, `held` running and
    `done` done jobs, analyzed before the claim (as after a quiet moment)."""
    dsn = (
        rota_bench.with_done_rows(new_database, done)
        if done
        else rota_bench.fresh(new_database, "rota_plans")
    )
    rota_bench.enqueue_batches(dsn, ready)
    worker = "bench:plans:1"
    found: dict[str, Any] = {"ready": ready, "done": done, "running": held}
    with psycopg.connect(dsn) as conn:
        conn.execute(b"ANALYZE rota.job")
        conn.commit()
        jobs = _running(conn, worker, held)
        finish = _finish_params(jobs, worker)
        heartbeat = {
            "ids": [i for i, _ in jobs],
            "claims": [a for _, a in jobs],
            "worker": worker,
            "lease": 30,
            "now": None,
        }
        claim = _claim_params("bench:plans:2", 100, 30, None, None)
        params = {"claim_jobs": claim, "extend_leases": heartbeat, "write_outcomes": finish}
        for name in HOT:
            entry: dict[str, Any] = {"generic_plan": _explain_generic(conn, name)}
            for mode in ("force_custom_plan", "force_generic_plan"):
                # The quickest of three: the machine is shared, the plan is the point.
                tries = [_explain_analyze(conn, name, params[name], mode) for _ in range(3)]
                plan, ms = min(tries, key=lambda t: t[1])
                entry[mode] = {"plan": plan, "execution_ms": ms, "all_ms": [t[1] for t in tries]}
            found[name] = entry
    # As the worker runs them: psycopg prepares after 5 calls, then PostgreSQL
    # plans 5 custom plans before it weighs a generic one.
    mark = log_path.stat().st_size
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(b"LOAD 'auto_explain'")
        conn.execute(b"SET auto_explain.log_min_duration = 0")
        conn.execute(b"SET auto_explain.log_analyze = on")
        conn.execute(b"SET auto_explain.log_timing = off")
        for name in HOT:
            found[name]["calls_ms"] = [round(x, 2) for x in _calls(conn, name, params[name], 20)]
        prepared = conn.execute(
            b"SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        ).fetchall()
    for statement, generic, custom in prepared:
        for name in HOT:
            if f"/* bench:{name} */" in statement:
                found[name]["prepared"] = {"generic_plans": generic, "custom_plans": custom}
    logged = log_path.read_text(errors="replace")[mark:]
    for name in HOT:
        found[name]["executed_plans"] = _executed_plans(logged, f"/* bench:{name} */")
    return found


def _executed_plans(log: str, marker: str) -> list[str]:
    """Per auto_explain entry of the statement holding `marker`: its duration, whether
    the plan was generic (parameters left as $n) or custom, and its join."""
    plans = []
    for entry in log.split("LOG:  duration: ")[1:]:
        if marker not in entry:
            continue
        head, _, plan = entry.partition("Query Text:")
        duration = head.split(" ms")[0]
        body = plan.split("\n", 1)[-1] if "\n" in plan else plan
        # The query text comes first; the plan starts at its first node.
        nodes = re.findall(r"(Hash Join|Nested Loop|Merge Join)", body)
        kind = "generic" if re.search(r"\$\d", body.split("Update on", 1)[-1]) else "custom"
        plans.append(f"{duration} ms, {kind}, {nodes[0] if nodes else 'no join'}")
    return plans


# -- 2 and 3. drains -----------------------------------------------------------
def rota_drain(
    new_database: NewDatabase, jobs: int, processes: int, server: Server, custom: bool
) -> Drain:
    dsn = rota_bench.fresh(new_database, "rota_drain")
    rota_bench.enqueue_batches(dsn, jobs)
    env = {"ROTA_DATABASE_URL": dsn}
    if custom:
        env["PGOPTIONS"] = "-c plan_cache_mode=force_custom_plan"
    command = rota_bench.worker_command(100)
    return timed_drain(
        dsn,
        (rota_bench.REMAINING, rota_bench.ANY_LEFT),
        jobs,
        lambda: [spawn(command, env) for _ in range(processes)],
        "rota worker, concurrency 100" + (", force_custom_plan" if custom else ""),
        server,
    )


def raw_drain(
    new_database: NewDatabase,
    jobs: int,
    processes: int,
    server: Server,
    mode: str,
    custom: bool,
    batch: int,
) -> Drain:
    dsn = rota_bench.fresh(new_database, "raw_drain")
    rota_bench.enqueue_batches(dsn, jobs)
    command = ["-m", "bench.findings", "raw-worker", dsn, "--mode", mode, "--batch", str(batch)]
    if custom:
        command.append("--custom-plans")
    return timed_drain(
        dsn,
        (rota_bench.REMAINING, rota_bench.ANY_LEFT),
        jobs,
        lambda: [spawn(command) for _ in range(processes)],
        f"raw loop, {mode}, batch {batch}" + (", force_custom_plan" if custom else ""),
        server,
    )


def halted_by_sigterm() -> threading.Event:
    """Set when this process gets SIGTERM (how the benchmark stops its workers)."""
    halt = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: halt.set())
    return halt


def raw_worker(dsn: str, mode: str, custom: bool, batch: int) -> None:
    """Claim `batch` no-op jobs, "run" them, write their outcomes; until SIGTERM.

    serial: claim (commit), then the outcomes (commit): two round trips, two
    commits per batch. pipelined: the outcomes of the batch just run and the
    next claim are sent together and committed once: one round trip.
    """
    halt = halted_by_sigterm()
    worker = f"raw:{os.getpid()}"
    options = "-c plan_cache_mode=force_custom_plan" if custom else ""
    claim_params = _claim_params(worker, batch, 30, None, None)
    claim_sql, finish_sql = sql.query("claim_jobs"), sql.query("write_outcomes")
    with psycopg.connect(dsn, options=options, autocommit=(mode == "serial")) as conn:
        held: list[tuple[int, int]] = []
        while not halt.is_set():
            if mode == "serial":
                if held:
                    conn.execute(finish_sql, _finish_params(held, worker))
                rows = conn.execute(claim_sql, claim_params).fetchall()
            else:
                with conn.pipeline():
                    if held:
                        conn.execute(finish_sql, _finish_params(held, worker))
                    cursor = conn.execute(claim_sql, claim_params)
                    conn.commit()
                rows = cursor.fetchall()
            held = [(r[0], r[6]) for r in rows]  # the no-op handlers have run
            if not held:
                time.sleep(0.01)


# -- 4. the latency floor --------------------------------------------------------
LATENCY_GAP = Plan.gap
"""Seconds between latency jobs: those of `make bench`'s latency rounds."""


def raw_listener(dsn: str, flushed: bool) -> None:
    """Until SIGTERM: wait for a NOTIFY on the claim's own connection (or half a
    second), claim up to 10 jobs with Rota's claim in its own commit, and note
    each job's start as the benchmark's latency handler does. Nothing else
    runs: no event loop, no thread hand-off, no lease keeping."""
    halt = halted_by_sigterm()
    options = "" if flushed else "-c synchronous_commit=off"
    worker = f"raw:{os.getpid()}"
    claim_sql = sql.query("claim_jobs")
    params = _claim_params(worker, 10, 30, None, None)
    with psycopg.connect(dsn, autocommit=True, options=options) as conn:
        conn.execute(sql.query("listen_jobs"))
        while not halt.is_set():
            for _ in conn.notifies(timeout=0.5, stop_after=1):
                break
            for row in conn.execute(claim_sql, params).fetchall():
                payload = row[2]  # the claim returns a Job's columns: payload third
                record_start(payload["path"], payload["t"])


def _raw_latency(new_database: NewDatabase, jobs: int, flushed: bool) -> Latency:
    dsn = rota_bench.fresh(new_database, "raw_latency")
    command = ["-m", "bench.findings", "raw-listener", dsn]
    if not flushed:
        command.append("--claim-not-flushed")
    with psycopg.connect(dsn, autocommit=True) as conn:
        return timed_latency(
            lambda: [spawn(command)],
            lambda payload: rota_bench.enqueue_latency_job(conn, payload),
            jobs,
            LATENCY_GAP,
            "raw listener" + ("" if flushed else ", synchronous_commit=off for its claims"),
        )


def latencies(
    new_database: NewDatabase, jobs: int, rounds: int, say: Callable[[str], None]
) -> dict[str, list[Latency]]:
    """Each setup once a round, the order turning from round to round."""
    setups: dict[str, Callable[[], Latency]] = {
        "worker": lambda: rota_bench.latency(new_database, jobs, LATENCY_GAP),
        "raw listener": lambda: _raw_latency(new_database, jobs, flushed=True),
        "raw listener, claim not flushed": lambda: _raw_latency(new_database, jobs, False),
    }
    names = list(setups)
    found: dict[str, list[Latency]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            say(f"round {round_ + 1}: enqueue-to-start latency, {name}")
            found[name].append(setups[name]())
    return found


def latency_table(found: dict[str, list[Latency]]) -> str:
    lines = [
        "| setup | p50 ms (each round) | p99 ms (each round) | enqueue call alone, p50 ms |",
        "|---|---:|---:|---:|",
    ]

    def each(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    for name, runs in found.items():
        enqueue = [r.enqueue_p50_ms for r in runs if r.enqueue_p50_ms is not None]
        lines.append(
            f"| {name} | {each([r.p50_ms for r in runs])} | {each([r.p99_ms for r in runs])} "
            f"| {each(enqueue)} |"
        )
    return "\n".join(lines)


# -- the whole run -------------------------------------------------------------
def drains(
    new_database: NewDatabase, server: Server, jobs: int, rounds: int, say: Callable[[str], None]
) -> dict[str, dict[int, list[Drain]]]:
    setups: dict[str, Callable[[int], Drain]] = {
        "worker": lambda p: rota_drain(new_database, jobs, p, server, custom=False),
        "worker, force_custom_plan": lambda p: rota_drain(new_database, jobs, p, server, True),
        "raw serial": lambda p: raw_drain(new_database, jobs, p, server, "serial", False, 100),
        "raw pipelined": lambda p: raw_drain(
            new_database, jobs, p, server, "pipelined", False, 100
        ),
        "raw pipelined, force_custom_plan": lambda p: raw_drain(
            new_database, jobs, p, server, "pipelined", True, 100
        ),
    }
    if available().get("pgqueuer-uvloop"):
        setups["pgqueuer-uvloop"] = lambda p: PgQueuerUvloop(new_database("pgq_uv")).drain(
            jobs, p, server
        )
    return take_turns(setups, rounds, say)


def drain_table(found: dict[str, dict[int, list[Drain]]]) -> str:
    return measure.drain_table(
        found,
        [
            ("server CPU s / 1,000 jobs", "cpu_seconds_per_1000_jobs", ".3f"),
            ("WAL bytes / job", "wal_bytes_per_job", ",.0f"),
            ("commits / job", "commits_per_job", ".4f"),
        ],
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["raw-worker"]:
        worker = argparse.ArgumentParser(prog="python -m bench.findings raw-worker")
        worker.add_argument("dsn")
        worker.add_argument("--mode", choices=["serial", "pipelined"], required=True)
        worker.add_argument("--custom-plans", action="store_true")
        worker.add_argument("--batch", type=int, default=100)
        w = worker.parse_args(argv[1:])
        raw_worker(w.dsn, w.mode, w.custom_plans, w.batch)
        return 0
    if argv[:1] == ["raw-listener"]:
        listener = argparse.ArgumentParser(prog="python -m bench.findings raw-listener")
        listener.add_argument("dsn")
        listener.add_argument("--claim-not-flushed", action="store_true")
        args_ = listener.parse_args(argv[1:])
        raw_listener(args_.dsn, flushed=not args_.claim_not_flushed)
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.findings", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--done-rows", type=int, default=200_000, help="for the plans")
    parser.add_argument("--skip-drains", action="store_true")
    parser.add_argument(
        "--latency-jobs",
        type=int,
        default=Plan.latency_jobs,
        help=f"jobs per latency round ({Plan.latency_jobs}; 0: none)",
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.rounds < 1 or args.done_rows < 0 or args.latency_jobs < 0:
        parser.error(
            "--jobs and --rounds must be positive, --done-rows and --latency-jobs not negative"
        )
    logging.basicConfig(level=logging.WARNING)

    from rota.testing import EmbeddedPostgres

    say = lambda text: print(f"... {text}", file=sys.stderr, flush=True)  # noqa: E731
    counter = iter(range(10**6))
    report: dict[str, Any] = {}
    with EmbeddedPostgres(durable=True) as pg:
        server = Server(pg.data, pg.url())
        try:
            report["postgres"] = server.version()
            new_database = lambda name: pg.create_database(f"{name}_{next(counter)}")  # noqa: E731
            say("plans of the hot statements")
            report["plans"] = plans(
                new_database, pg.root / "server.log", ready=20_000, done=args.done_rows, held=100
            )
            if not args.skip_drains:
                found = drains(new_database, server, args.jobs, args.rounds, say)
                report["drains"] = {
                    name: {str(p): [dataclasses.asdict(d) for d in runs] for p, runs in bp.items()}
                    for name, bp in found.items()
                }
                report["drain_table"] = drain_table(found)
            if args.latency_jobs:
                waits = latencies(new_database, args.latency_jobs, args.rounds, say)
                report["latency"] = {
                    name: [dataclasses.asdict(r) for r in runs] for name, runs in waits.items()
                }
                report["latency_table"] = latency_table(waits)
        finally:
            server.close()
    report["load_average_at_end"] = list(os.getloadavg())
    _print(report)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2, default=str)
    return 0


def _print(report: dict[str, Any]) -> None:
    print(f"PostgreSQL {report['postgres']}")
    p = report["plans"]
    print(f"\nplans with {p['ready']:,} ready, {p['running']} running, {p['done']:,} done rows")
    for name in HOT:
        entry = p[name]
        print(f"\n## {name}\nEXPLAIN (GENERIC_PLAN):\n{entry['generic_plan']}")
        for mode in ("force_custom_plan", "force_generic_plan"):
            print(f"\n{mode}: {entry[mode]['execution_ms']:.2f} ms\n{entry[mode]['plan']}")
        print(f"\ncalls as the worker runs them (ms): {entry['calls_ms']}")
        print(f"pg_prepared_statements: {entry.get('prepared')}")
        print("executed plans, call by call:")
        for i, plan in enumerate(entry["executed_plans"], 1):
            print(f"  {i:2}: {plan}")
    if "drain_table" in report:
        print()
        print(report["drain_table"])
    if "latency_table" in report:
        print(f"\nenqueue-to-start, one job every {LATENCY_GAP * 1000:g} ms to an idle process")
        print(report["latency_table"])
    print(f"\nload average at the end: {report['load_average_at_end']}")


if __name__ == "__main__":
    sys.exit(main())
