"""`python -m bench.feature_costs`: what each feature on Rota's hot path costs
the server per job, and all of them together.

Each variant is the table `rota migrate` makes with one feature taken off
the hot path (an index dropped, a trigger dropped, the key's unique
constraint made a partial index), and one with all of them taken off. Every
variant gets a database of its own on one durable server, and the variants
take turns, in a new order each round, at the worker's own three statements
on batches of jobs: `rota.enqueue_many`, `rota.claim` and `write_outcomes`
(every job done). The server's execution time of each statement is read from
`pg_stat_statements` (top-level statements, their triggers included) and
reported in µs per job, so that the client's own time, the same for every
variant, is not in it.

No variant is a schema Rota could ship: each gives up what the feature is for
(see `FEATURES`). The question it answers is what leaving features off the
hot path could buy at most.

    python -m bench.feature_costs [--rounds 15] [--statements 8] [--batch 500] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections.abc import Callable
from typing import Any

import psycopg

import rota
from rota import claim
from rota.attempt import Attempt
from rota.jobs import Outcome
from rota.migrate import use_key_index

BASE = "the schema `rota migrate` makes"
ALL = "all of them off"

FEATURES: dict[str, tuple[str, str]] = {
    "the key's constraint as a partial index": (
        "",
        "a hand-written `ON CONFLICT (idempotency_key)` without its `WHERE`",
    ),
    "no type index": (
        "DROP INDEX rota.job_type_idx",
        "`rota jobs list --type` and the console's type pages in id order",
    ),
    "no group index": (
        "DROP INDEX rota.job_group_ready_idx",
        "the limited claim's walk of groups, the counts of ready jobs per type",
    ),
    "no input guard": (
        "DROP TRIGGER job_checked_insert ON rota.job",
        "the input checks of a direct `INSERT` (issue 45's promise)",
    ),
    "no end index": (
        "DROP INDEX rota.job_terminal_idx",
        "the archive's and retention's walk by end",
    ),
    "no running index": (
        "DROP INDEX rota.job_running_idx",
        "the reaper's walk of expired leases",
    ),
    "no notify trigger": (
        "DROP TRIGGER job_notify_ready ON rota.job",
        "idle workers woken by an enqueue (they would poll)",
    ),
    "no done-count trigger": (
        "DROP TRIGGER job_done_count_insert ON rota.job",
        "done counts of jobs inserted done (imports)",
    ),
    "no hand-started triggers": (
        "DROP TRIGGER job_unslotted_insert ON rota.job;"
        " DROP TRIGGER job_unslotted_update ON rota.job",
        "a job made running by hand counted against its settled limit",
    ),
}
"""Each feature taken off: the SQL that takes it off (the key's index is made
by `use_key_index`), and what would be lost."""

KINDS = {"enqueue": "WITH input AS", "claim": "WITH limited AS", "outcome": "WITH written AS"}
"""Each statement by how its text starts (after its comments)."""


def variants() -> list[str]:
    return [BASE, *FEATURES, ALL]


def prepare(dsn: str, variant: str) -> None:
    rota.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, (ddl, _) in FEATURES.items():
            if variant not in (name, ALL):
                continue
            for statement in filter(str.strip, ddl.split(";")):
                conn.execute(statement.encode())
            if not ddl:
                use_key_index(conn, "partial")
        conn.execute(b"CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def cycle(conn: psycopg.Connection[Any], batch: int, first: int) -> None:
    """One statement of each kind, `batch` jobs each."""
    rota.enqueue_many(conn, [rota.NewJob("bench.noop", {"i": first + i}) for i in range(batch)])
    jobs = claim.claim(conn, "bench", batch, 30)
    if len(jobs) != batch:
        raise RuntimeError(f"claimed {len(jobs)} of {batch} jobs")
    claim.write_outcomes(conn, "bench", [Attempt.of(j, Outcome.DONE) for j in jobs])


def measure(
    new_database: Callable[[str], str],
    admin_dsn: str,
    rounds: int,
    statements: int,
    batch: int,
    say: Callable[[str], None],
) -> dict[str, dict[str, float]]:
    """µs of server execution per job, by variant and statement."""
    names = variants()
    dsns = {name: new_database(f"features_{i}") for i, name in enumerate(names)}
    for name, dsn in dsns.items():
        prepare(dsn, name)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(b"CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        admin.execute(b"SELECT pg_stat_statements_reset()")
    conns = {name: psycopg.connect(dsn, autocommit=True) for name, dsn in dsns.items()}
    try:
        first = 0
        for r in range(rounds):
            say(f"round {r + 1} of {rounds}")
            order = names[:]
            random.shuffle(order)
            for name in order:
                for _ in range(statements):
                    cycle(conns[name], batch, first)
                    first += batch
    finally:
        for conn in conns.values():
            conn.close()
    by_database = {dsn.rsplit("/", 1)[1]: name for name, dsn in dsns.items()}
    found: dict[str, dict[str, float]] = {name: {} for name in names}
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        rows = admin.execute(
            b"SELECT d.datname, s.query, s.calls, s.total_exec_time"
            b" FROM pg_stat_statements AS s JOIN pg_database AS d ON d.oid = s.dbid"
            b" WHERE s.toplevel"
        ).fetchall()
    for database, query, calls, total_ms in rows:
        variant = by_database.get(database)
        if variant is None or calls < rounds * statements:
            continue
        for kind, start in KINDS.items():
            if start in query:
                found[variant][kind] = total_ms * 1000 / calls / batch
    return found


def table(found: dict[str, dict[str, float]]) -> str:
    base = sum(found[BASE].values())
    lines = [
        "| variant | enqueue | claim | outcome | total | saved | what it gives up |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, by_kind in found.items():
        total = sum(by_kind.values())
        lost = FEATURES[name][1] if name in FEATURES else ""
        cells = " | ".join(f"{by_kind.get(kind, float('nan')):.2f}" for kind in KINDS)
        lines.append(
            f"| {name} | {cells} | {total:.2f} | {base - total:.2f} ({(base - total) / base:.0%})"
            f" | {lost} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.feature_costs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--statements", type=int, default=8, help="of each kind, per round")
    parser.add_argument("--batch", type=int, default=500, help="jobs per statement")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if min(args.rounds, args.statements, args.batch) < 1:
        parser.error("--rounds, --statements and --batch must be positive")
    logging.basicConfig(level=logging.WARNING)

    from rota.testing import EmbeddedPostgres

    say = lambda text: print(f"... {text}", file=sys.stderr, flush=True)  # noqa: E731
    pg = EmbeddedPostgres(durable=True)
    with open(pg.data / "postgresql.conf", "a") as conf:
        conf.write("shared_preload_libraries = 'pg_stat_statements'\n")
    with pg:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            version = conn.execute(b"SHOW server_version").fetchone()[0]  # type: ignore[index]
        found = measure(pg.create_database, pg.url(), args.rounds, args.statements, args.batch, say)
    report = {
        "postgres": version,
        "python": sys.version.split()[0],
        "rounds": args.rounds,
        "statements": args.statements,
        "batch": args.batch,
        "us_per_job": found,
        "table": table(found),
    }
    print(
        f"µs of server execution per job, {args.rounds} rounds of {args.statements} statements"
        f" of each kind, {args.batch} jobs a statement\n"
    )
    print(report["table"])
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
