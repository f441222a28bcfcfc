"""What the database's input checks (migration 0024) cost an enqueue.

Enqueues the same jobs with the checking triggers enabled and disabled, in
alternating rounds on one database (each case on an emptied table, enabled
and disabled taking turns going first), and prints the median time per job of each:
one job per statement (rota.enqueue from Python and rota.enqueue() in SQL),
batches of 1,000 (rota.enqueue_many), and one INSERT of 20,000 rows (the
trigger's cost alone, without round trips). The payloads are small (a few keys) and
large (a 200 KB document), since the checks walk the payload.

    python -m bench.input_checks postgresql://.../db   # a migrated database
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import psycopg

import rota

TRIGGERS = ("job_checked_insert",)
SMALL = {"to": "a@example.com", "order": 42, "lines": [{"sku": "x", "n": 2}]}
LARGE = {"doc": [{"k": i, "v": "x" * 90} for i in range(2000)]}


def _set_checks(conn: psycopg.Connection, on: bool) -> None:
    verb = "ENABLE" if on else "DISABLE"
    for trigger in TRIGGERS:
        conn.execute(f"ALTER TABLE rota.job {verb} TRIGGER {trigger}")  # type: ignore[arg-type]


def _per_job(run: Callable[[psycopg.Connection], int], conn: psycopg.Connection) -> float:
    start = time.perf_counter()
    jobs = run(conn)
    return (time.perf_counter() - start) / jobs * 1e6


def main(url: str, rounds: int = 5) -> None:
    cases: dict[str, Callable[[psycopg.Connection], int]] = {
        "enqueue, small payload": lambda c: (
            [rota.enqueue(c, "t", SMALL) for _ in range(500)] and 500
        ),
        "enqueue, 200 KB payload": lambda c: (
            [rota.enqueue(c, "t", LARGE) for _ in range(50)] and 50
        ),
        "SQL rota.enqueue(), small": lambda c: (
            c.execute(
                "SELECT rota.enqueue('t', %s::jsonb) FROM generate_series(1, 500)",
                (psycopg.types.json.Jsonb(SMALL),),
            )
            and 500
        ),
        "enqueue_many x1000, small": lambda c: len(
            rota.enqueue_many(c, [rota.NewJob("t", SMALL) for _ in range(1000)])
        ),
        "INSERT of 20,000 rows, small (server only)": lambda c: (
            c.execute(
                "INSERT INTO rota.job (type, payload)"
                " SELECT 't', %s FROM generate_series(1, 20000)",
                (psycopg.types.json.Jsonb(SMALL),),
            ).rowcount
        ),
    }
    with psycopg.connect(url, autocommit=True) as conn:
        results: dict[tuple[str, bool], list[float]] = {}
        for n in range(rounds):
            for on in (False, True) if n % 2 else (True, False):  # each goes first in turn
                _set_checks(conn, on)
                for name, case in cases.items():
                    conn.execute("TRUNCATE rota.job")  # each case on an empty table
                    results.setdefault((name, on), []).append(_per_job(case, conn))
        _set_checks(conn, True)
    print("| case | without checks (µs/job) | with checks (µs/job) | ratio |")
    print("|---|---|---|---|")
    for name in cases:
        off = statistics.median(results[(name, False)])
        on = statistics.median(results[(name, True)])
        print(f"| {name} | {off:.1f} | {on:.1f} | {on / off:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
