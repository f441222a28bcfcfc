"""`python -m bench.schema_ab`: drains of Rota's schema and variants of it, taking turns
on one durable PostgreSQL server.

Each variant is a label and SQL run after `rota migrate` on its fresh database
("current" runs none); every round drains the same no-op jobs once per variant,
the order turned around every other round. It reports, per variant, the
median jobs/s, the server's CPU and WAL per job and the workers' CPU, and the
server's CPU and WAL for enqueueing the drain's jobs: what a change to the
table or its indexes buys, measured in one run.

    python -m bench.schema_ab --rounds 4 \\
        --variant 'ff50=ALTER TABLE rota.job SET (fillfactor = 50)'
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys

import psycopg

from bench import rota_bench
from bench.server import Server


def parse_variant(text: str) -> tuple[str, str]:
    label, sep, statement = text.partition("=")
    if not sep or not label.strip() or not statement.strip():
        raise argparse.ArgumentTypeError(f"--variant wants LABEL=SQL, not {text!r}")
    return label.strip(), statement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.schema_ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--variant", action="append", type=parse_variant, default=[])
    rota_bench.add_drain_options(parser, rounds=4)
    parser.add_argument(
        "--done-rows",
        type=int,
        default=0,
        help="drain beside this many done rows (one database per variant, kept for every round)",
    )
    parser.add_argument(
        "--latency", type=int, default=0, help="also time the enqueue-to-start of this many jobs"
    )
    args = parser.parse_args(argv)
    rota_bench.check_drain_options(parser, args)
    if args.done_rows < 0 or args.latency < 0:
        parser.error("--done-rows and --latency must not be negative")
    variants: dict[str, str | None] = {"current": None, **dict(args.variant)}

    from rota.testing import EmbeddedPostgres

    names = itertools.count()
    drains: dict[str, list[rota_bench.Drain]] = {label: [] for label in variants}
    latencies: dict[str, list[rota_bench.Latency]] = {label: [] for label in variants}
    with EmbeddedPostgres(durable=True) as pg:
        server = Server(pg.data, pg.url())

        def new_database(statement: str | None, done_rows: int = 0) -> str:
            dsn = rota_bench.fresh(lambda name: pg.create_database(f"{name}_{next(names)}"), "ab")
            if statement:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(statement.encode())
            if done_rows:
                rota_bench.add_done_rows(dsn, done_rows)
            return dsn

        try:
            beside = {
                label: new_database(statement, args.done_rows)
                for label, statement in variants.items()
                if args.done_rows
            }
            for round_ in range(args.rounds):
                order = list(variants)[:: 1 if round_ % 2 == 0 else -1]
                for label in order:
                    print(f"... round {round_ + 1}: {label}", file=sys.stderr, flush=True)
                    if args.latency:
                        dsn = new_database(variants[label])
                        latencies[label].append(
                            rota_bench.latency(lambda _name, dsn=dsn: dsn, args.latency, 0.015)
                        )
                    dsn = beside.get(label) or new_database(variants[label])
                    drains[label].append(
                        rota_bench.drain(
                            pg.create_database,
                            args.jobs,
                            args.processes,
                            args.concurrency,
                            server,
                            dsn=dsn,
                        )
                    )
        finally:
            server.close()

    print(
        f"\n{args.jobs:,} no-op jobs per drain, {args.processes} process(es), concurrency "
        f"{args.concurrency}, {args.rounds} rounds"
        + (f", beside {args.done_rows:,} done rows" if args.done_rows else "")
        + "\n"
    )
    print(
        "| variant | median jobs/s | rounds | server CPU s / 1,000 | worker CPU s / 1,000"
        " | WAL bytes / job | enqueue: server CPU s / 1,000 | enqueue: WAL bytes / job |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for label, runs in drains.items():
        each = ", ".join(f"{d.rate:,.0f}" for d in runs)
        server_cpu = statistics.median(d.cpu_seconds_per_1000_jobs or 0.0 for d in runs)
        worker_cpu = statistics.median(d.worker_cpu_seconds_per_1000_jobs or 0.0 for d in runs)
        wal = statistics.median(d.wal_bytes_per_job or 0.0 for d in runs)
        # The enqueue of the drain's jobs (batches of 1,000), measured apart.
        enqueue_cpu = statistics.median(
            1000 * (d.enqueue_cpu_seconds or 0.0) / d.jobs for d in runs
        )
        enqueue_wal = statistics.median((d.enqueue_wal_bytes or 0) / d.jobs for d in runs)
        print(
            f"| {label} | {statistics.median(d.rate for d in runs):,.0f} | {each} |"
            f" {server_cpu:.3f} | {worker_cpu:.3f} | {wal:,.0f} | {enqueue_cpu:.4f}"
            f" | {enqueue_wal:,.0f} |"
        )
    if args.latency:
        print(f"\nenqueue-to-start of {args.latency} jobs, one at a time\n")
        print("| variant | p50 ms (median of rounds) | p99 ms | enqueue call p50 ms |")
        print("|---|---:|---:|---:|")
        for label, runs in latencies.items():
            print(
                f"| {label} | {statistics.median(r.p50_ms for r in runs):.1f}"
                f" | {statistics.median(r.p99_ms for r in runs):.1f}"
                f" | {statistics.median(r.enqueue_p50_ms or 0 for r in runs):.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
