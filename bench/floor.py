"""`python -m bench.floor`: the least a PostgreSQL queue can make the server spend
per job, beside Rota and pgqueuer, in one run on one durable server.

Each shape is a loop with no handler and no Python per job beyond reading the
claimed rows, and all but the last run on a table of the fewest columns a
queue needs and one partial index (the ready rows, in run order); the jobs
are enqueued before the drain, 1,000 rows a statement, as for every queue of
`make bench`:

- `one write`: a job taken by deleting its row (`DELETE ... RETURNING` over
  `FOR UPDATE SKIP LOCKED`). A job lost with its worker is lost: at most once,
  the floor of any queue that writes anything per job.
- `claim, delete`: a claim that marks the row taken (worker, lease), then the
  row deleted when the job ends; the outcomes of one batch and the next claim
  in one round trip and one commit. The least an at-least-once queue writes
  (a taken job must be found again if its worker dies): pgqueuer's shape,
  without its log table.
- `claim, mark done`: the same, with the row kept and marked done, as
  Rota keeps one row per job.
- `claim, mark done, on Rota's table`: those two statements on the table
  `rota migrate` makes (its columns, indexes, triggers and checks), so that
  what Rota's table costs and what its statements add show apart.
- `claim, move to history`: the narrow table as a hot table of the jobs not
  yet ended, and a job that ends deleted from it and written once to a history
  table (its primary key and an index by end), the outcomes of a batch in one
  statement: one row kept per job, as Rota keeps, in the shape of a hot table
  split.
- `claim, move to history, on Rota's table split`: that split made of the
  table `rota migrate` makes, every feature's index kept (`SPLIT` below):
  what a hot table and a history table would cost Rota, measured instead of
  counted.

Beside them, Rota's worker, pgqueuer on uvloop and Graphile Worker (when
`make bench-graphile` has installed it) drain the same jobs, so the
run has both the denominators of the benchmark's goals (pgqueuer's CPU per
job, server and worker) and Rota's worker's CPU per job. The report then says, for
each shape, the fastest drain two cores allow with that server cost and Rota's
worker, over pgqueuer's drain: a 2-process drain on two cores is CPU-bound for
every queue, so that is the most a queue of that shape could reach here.

    python -m bench.floor [--rounds 5] [--jobs 20000] [--json floor.json] [--only SETUP ...]
    python -m bench.floor raw-worker DSN --shape one-write|claim-delete|claim-mark-done|...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Collection
from typing import Any

import psycopg

from bench import rota_bench
from bench.findings import halted_by_sigterm
from bench.measure import (
    Drain,
    drain_table,
    enqueue_costed,
    median_of,
    spawn,
    take_turns,
    timed_drain,
)
from bench.peers import GraphileWorker, PgQueuerUvloop, available
from bench.server import Server
from rota.migrate import use_key_index

NewDatabase = Callable[[str], str]

TABLE = b"""
CREATE SCHEMA floor;
CREATE TABLE floor.job (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status smallint NOT NULL DEFAULT 0,  -- 0 ready, 1 taken, 2 done
    run_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL,
    worker text,
    lease_until timestamptz,
    finished_at timestamptz
);
CREATE INDEX job_ready_idx ON floor.job (run_at, id) WHERE status = 0;
CREATE TABLE floor.history (
    id bigint PRIMARY KEY,
    payload jsonb NOT NULL,
    worker text,
    finished_at timestamptz NOT NULL
);
CREATE INDEX history_finished_idx ON floor.history (finished_at);
"""

REMAINING = (
    "SELECT (SELECT count(*) FROM floor.job WHERE status = 0)"
    " + (SELECT count(*) FROM floor.job WHERE status = 1)"
)
ANY_LEFT = (
    "SELECT EXISTS (SELECT FROM floor.job WHERE status = 0)"
    " OR EXISTS (SELECT FROM floor.job WHERE status = 1)"
)

TAKE = b"""
DELETE FROM floor.job WHERE id IN (
    SELECT id FROM floor.job WHERE status = 0 ORDER BY run_at, id
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
CLAIM = b"""
UPDATE floor.job j SET status = 1, worker = %(worker)s,
    lease_until = now() + interval '30 seconds'
FROM (SELECT id FROM floor.job WHERE status = 0 ORDER BY run_at, id
      LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
WHERE j.id = c.id
RETURNING j.id, j.payload
"""
DELETE = b"DELETE FROM floor.job WHERE id = ANY(%(ids)s) AND worker = %(worker)s"
DONE = (
    b"UPDATE floor.job SET status = 2, finished_at = now(), lease_until = NULL"
    b" WHERE id = ANY(%(ids)s) AND worker = %(worker)s"
)
MOVE = b"""
WITH ended AS (
    DELETE FROM floor.job WHERE id = ANY(%(ids)s) AND worker = %(worker)s
    RETURNING id, payload, worker)
INSERT INTO floor.history (id, payload, worker, finished_at)
SELECT id, payload, worker, now() FROM ended
"""
# The same two statements on the table `rota migrate` makes, its indexes,
# triggers and checks: what Rota's table costs, apart from its statements.
ROTA_CLAIM = b"""
UPDATE rota.job j SET status = 'running', locked_by = %(worker)s,
    locked_until = now() + interval '30 seconds', attempts = j.attempts + 1,
    started_at = now()
FROM (SELECT id FROM rota.job WHERE status = 'ready' AND priority = 0
      ORDER BY run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
WHERE j.id = c.id
RETURNING j.id, j.payload
"""
ROTA_DONE = (
    b"UPDATE rota.job SET status = 'done', finished_at = now(), locked_until = NULL"
    b" WHERE id = ANY(%(ids)s) AND locked_by = %(worker)s"
)
# Rota's table split in two, every feature's index kept: rota.job holds the
# jobs not yet ended (the claim, group, running, limit, unique-window,
# schedule, parent and waiting indexes, the key's index holding keyed rows
# only: `rota migrate --key-index partial`, which the shape asks for), and an
# ended job moves to rota.job_ended, which carries what the listings, the
# archive and keys need (its primary key, the end, the type, the key) and the
# input checks' guard, as every door to a table of jobs must.
# Eight index entries a no-op job: three at the enqueue, two at the claim,
# three at the end. A key kept unique across both tables (a look into the
# history's key index at each keyed enqueue) costs a job without a key
# nothing, and is left out.
SPLIT = b"""
DROP INDEX rota.job_type_idx, rota.job_terminal_idx, rota.job_ended_idx,
    rota.job_ended_type_idx;
DROP TRIGGER job_done_count_delete ON rota.job;
DROP TRIGGER job_forget_durable ON rota.job;
DROP TRIGGER job_forget_effects ON rota.job;
CREATE TABLE rota.job_ended (LIKE rota.job INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    WITH (fillfactor = 100);
ALTER TABLE rota.job_ended ADD PRIMARY KEY (id);
CREATE INDEX job_ended_end_idx ON rota.job_ended (finished_at);
CREATE INDEX job_ended_type_idx ON rota.job_ended (type, id);
CREATE UNIQUE INDEX job_ended_key_idx ON rota.job_ended (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DO $$
DECLARE guard text;
BEGIN
    SELECT replace(pg_get_triggerdef(oid), ' ON rota.job ', ' ON rota.job_ended ')
    INTO STRICT guard
    FROM pg_trigger WHERE tgrelid = 'rota.job'::regclass AND tgname = 'job_checked_insert';
    EXECUTE guard;
END
$$;
"""
ROTA_MOVE = b"""
WITH ended AS (
    DELETE FROM rota.job WHERE id = ANY(%(ids)s) AND locked_by = %(worker)s
    RETURNING *)
INSERT INTO rota.job_ended
SELECT id, type, payload, idempotency_key, 'done', run_at, attempts, max_attempts,
    locked_by, NULL, last_error, created_at, started_at, now(), schedule_id, slot,
    priority, timeout_seconds, cancel_requested_at, releases, group_key, result, errors,
    trace_context, unique_key, unique_active, limit_slot, parent_id
FROM ended
"""


@dataclasses.dataclass(frozen=True)
class Shape:
    claim: bytes
    outcome: bytes | None
    """None: the claim takes the job for good (one write)."""
    rota_table: bool = False
    setup: bytes = b""
    """Run on Rota's table after `rota migrate`, before the enqueue."""
    key_index: str | None = None
    """How Rota's table keeps keys unique (`rota migrate --key-index`); None:
    as `rota_bench.fresh` makes it."""


SHAPES = {
    "one write": Shape(TAKE, None),
    "claim, delete": Shape(CLAIM, DELETE),
    "claim, mark done": Shape(CLAIM, DONE),
    "claim, mark done, on Rota's table": Shape(ROTA_CLAIM, ROTA_DONE, rota_table=True),
    "claim, move to history": Shape(CLAIM, MOVE),
    "claim, move to history, on Rota's table split": Shape(
        ROTA_CLAIM, ROTA_MOVE, rota_table=True, setup=SPLIT, key_index="partial"
    ),
}
BATCH = 100
PEERS = ("pgqueuer-uvloop", "graphile-worker")
"""The peers `drains` runs beside the shapes when they are installed."""


def raw_worker(dsn: str, shape: Shape, batch: int = BATCH) -> None:
    """Take `batch` jobs at a time, "run" them, end them; until SIGTERM."""
    halt = halted_by_sigterm()
    worker = f"floor:{os.getpid()}"
    claim = {"limit": batch, "worker": worker}
    with psycopg.connect(dsn, autocommit=shape.outcome is None) as conn:
        held: list[int] = []
        while not halt.is_set():
            if shape.outcome is None:
                rows = conn.execute(shape.claim, claim).fetchall()
            else:
                with conn.pipeline():
                    if held:
                        conn.execute(shape.outcome, {"ids": held, "worker": worker})
                    cursor = conn.execute(shape.claim, claim)
                    conn.commit()
                rows = cursor.fetchall()
            held = [row[0] for row in rows]  # the jobs "ran"
            if not held:
                time.sleep(0.01)


def _option(name: str) -> str:
    return name.replace(",", "").replace("'", "").replace(" ", "-").lower()


def shape_drain(
    new_database: NewDatabase, jobs: int, processes: int, server: Server, name: str
) -> Drain:
    shape = SHAPES[name]
    if shape.rota_table:
        dsn = rota_bench.fresh(new_database, "floor_rota")
        if shape.key_index:
            use_key_index(dsn, shape.key_index)
        if shape.setup:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(shape.setup)
        cpu, wal = enqueue_costed(server, dsn, lambda: rota_bench.enqueue_batches(dsn, jobs))
        remaining = (rota_bench.REMAINING, rota_bench.ANY_LEFT)
    else:
        dsn = new_database("floor")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
        cpu, wal = enqueue_costed(server, dsn, lambda: _enqueue_narrow(dsn, jobs))
        remaining = (REMAINING, ANY_LEFT)
    command = ["-m", "bench.floor", "raw-worker", dsn, "--shape", _option(name)]
    drained = timed_drain(
        dsn,
        remaining,
        jobs,
        lambda: [spawn(command) for _ in range(processes)],
        f"loop of the fewest statements: {name}, batch {BATCH}",
        server,
    )
    return dataclasses.replace(drained, enqueue_cpu_seconds=cpu, enqueue_wal_bytes=wal)


def _enqueue_narrow(dsn: str, jobs: int) -> None:
    """The jobs of a narrow table, 1,000 rows a statement and a commit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, jobs, rota_bench.BATCH):
            conn.execute(
                b"INSERT INTO floor.job (payload) SELECT jsonb_build_object('i', g)"
                b" FROM generate_series(%s::int, %s::int) g",
                (start, min(start + rota_bench.BATCH, jobs) - 1),
            )


def drains(
    new_database: NewDatabase,
    server: Server,
    jobs: int,
    rounds: int,
    say: Callable[[str], None],
    only: Collection[str] = (),
) -> dict[str, dict[int, list[Drain]]]:
    setups: dict[str, Callable[[int], Drain]] = {
        "Rota's worker": lambda p: rota_bench.drain(new_database, jobs, p, 100, server),
    }
    for shape in SHAPES:
        setups[shape] = lambda p, shape=shape: shape_drain(new_database, jobs, p, server, shape)
    found = available()
    if found.get("pgqueuer-uvloop"):
        setups["pgqueuer-uvloop"] = lambda p: PgQueuerUvloop(new_database("pgq_uv")).drain(
            jobs, p, server
        )
    if found.get("graphile-worker"):
        setups["graphile-worker"] = lambda p: GraphileWorker(new_database("graphile")).drain(
            jobs, p, server
        )
    if only:
        setups = {name: run for name, run in setups.items() if _option(name) in only}
    return take_turns(setups, rounds, say)


def tables(found: dict[str, dict[int, list[Drain]]], cores: int) -> str:
    lines = [
        drain_table(
            found,
            [
                ("server CPU s / 1,000 jobs", "cpu_seconds_per_1000_jobs", ".3f"),
                (
                    "with the enqueue, server CPU s / 1,000 jobs",
                    "cpu_with_enqueue_per_1000_jobs",
                    ".3f",
                ),
                ("worker CPU s / 1,000 jobs", "worker_cpu_seconds_per_1000_jobs", ".3f"),
                ("WAL bytes / job", "wal_bytes_per_job", ",.0f"),
                ("with the enqueue, WAL bytes / job", "wal_with_enqueue_per_job", ",.0f"),
            ],
        )
    ]
    peer = found.get("pgqueuer-uvloop")
    if not peer or "Rota's worker" not in found:
        return "\n".join(lines)
    worker = found["Rota's worker"]
    lines += [
        "",
        f"Each shape's server CPU per job with Rota's worker CPU per job, against pgqueuer-uvloop"
        f" in the same run; the ceiling is the rate at which {cores} cores are busy with nothing"
        " else, over pgqueuer's measured drain.",
        "",
        "| shape | processes | server + Rota's worker, s / 1,000 jobs | over pgqueuer's total "
        "| the cores' ceiling over pgqueuer's drain |",
        "|---|---:|---:|---:|---:|",
    ]
    for processes in (1, 2):
        peer_total = median_of(peer[processes], "cpu_seconds_per_1000_jobs") + median_of(
            peer[processes], "worker_cpu_seconds_per_1000_jobs"
        )
        peer_rate = statistics.median(d.rate for d in peer[processes])
        rota_worker = median_of(worker[processes], "worker_cpu_seconds_per_1000_jobs")
        for name in [name for name in ["Rota's worker", *SHAPES] if name in found]:
            total = median_of(found[name][processes], "cpu_seconds_per_1000_jobs") + rota_worker
            ceiling = cores * 1000 / total
            lines.append(
                f"| {name} | {processes} | {total:.3f} | {total / peer_total:.2f} "
                f"| {ceiling / peer_rate:.2f} ({ceiling:,.0f} against {peer_rate:,.0f} jobs/s) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["raw-worker"]:
        worker = argparse.ArgumentParser(prog="python -m bench.floor raw-worker")
        worker.add_argument("dsn")
        shapes = {_option(name): shape for name, shape in SHAPES.items()}
        worker.add_argument("--shape", choices=list(shapes), required=True)
        w = worker.parse_args(argv[1:])
        raw_worker(w.dsn, shapes[w.shape])
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SETUP",
        help="run only this setup (repeatable), named as in --shape or rotas-worker, "
        "pgqueuer-uvloop, graphile-worker",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.rounds < 1:
        parser.error("--jobs and --rounds must be positive")
    known = [_option(name) for name in ["Rota's worker", *SHAPES, *PEERS]]
    unknown = sorted(set(args.only) - set(known))
    if unknown:
        parser.error(f"--only: no setup {', '.join(unknown)} (setups: {', '.join(known)})")
    logging.basicConfig(level=logging.WARNING)

    from rota.testing import EmbeddedPostgres

    say = lambda text: print(f"... {text}", file=sys.stderr, flush=True)  # noqa: E731
    counter = iter(range(10**6))
    with EmbeddedPostgres(durable=True) as pg:
        server = Server(pg.data, pg.url())
        try:
            version = server.version()
            new_database = lambda name: pg.create_database(f"{name}_{next(counter)}")  # noqa: E731
            found = drains(new_database, server, args.jobs, args.rounds, say, args.only)
        finally:
            server.close()
    cores = os.cpu_count() or 1
    report: dict[str, Any] = {
        "postgres": version,
        "python": sys.version.split()[0],
        "cores": cores,
        "drains": {
            name: {str(p): [dataclasses.asdict(d) for d in runs] for p, runs in by.items()}
            for name, by in found.items()
        },
        "table": tables(found, cores),
        "load_average_at_end": list(os.getloadavg()),
    }
    print(f"PostgreSQL {version}, Python {report['python']}, {cores} cores\n")
    print(report["table"])
    print(f"\nload average at the end: {report['load_average_at_end']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
