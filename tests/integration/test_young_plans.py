"""The hot statements keep keyed plans made while rota.job was small.

psycopg prepares a statement on its sixth run and PostgreSQL may then keep a
generic plan until the table's statistics change. Made on a new (or long idle,
nearly empty) table, such a plan read the whole table: a sequential scan that
was cheapest at a hundred rows and stayed in use while the table grew, until
autovacuum's next ANALYZE, up to a minute later. Every worker's claim, outcome
and every enqueue grew with the table meanwhile (2 ms to 9 ms a claim over
120,000 rows in this process).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import rota
from rota import claim as claims
from rota.claim import Attempt
from rota.floor import Floor
from rota.jobs import Outcome


@pytest.fixture
def plans(db_url: str) -> Iterator[tuple[psycopg.Connection[Any], list[str]]]:
    """A connection whose statements' plans are reported (auto_explain), and the
    plans reported."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        reported: list[str] = []
        conn.add_notice_handler(lambda d: reported.append(d.message_primary or ""))
        yield conn, reported


def _explain_from_now_on(conn: psycopg.Connection[Any]) -> None:
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_level = notice")
    conn.execute("SET auto_explain.log_nested_statements = on")


def _scans_of_the_whole_table(reported: list[str]) -> list[str]:
    return [plan for plan in reported if "Seq Scan on job " in plan]


def test_a_workers_plans_made_on_a_small_table_stay_keyed_as_it_grows(plans) -> None:
    conn, reported = plans
    floor = Floor(["t"])
    pending: list[Attempt] = []

    def turn() -> None:
        nonlocal pending
        rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(10)])
        since, _, generation = floor.bounds()
        _, jobs = claims.write_and_claim(conn, "w", pending, 50, 30.0, ["t"], None, since)
        floor.claimed(jobs, generation)
        pending = [Attempt.of(j, Outcome.DONE) for j in jobs]

    for _ in range(10):  # prepared and planned while the table is small
        turn()
        jobs = claims.claim(conn, "w", 1, 30.0, ["t"])
        claims.write_outcomes(conn, "w", [Attempt.of(j, Outcome.DONE) for j in jobs])
    conn.execute(
        "INSERT INTO rota.job (type, status, finished_at, attempts)"
        " SELECT 't', 'done', now(), 1 FROM generate_series(1, 30000)"
    )
    _explain_from_now_on(conn)
    turn()
    rota.enqueue(conn, "t")
    jobs = claims.claim(conn, "w", 1, 30.0, ["t"])
    claims.write_outcomes(conn, "w", [Attempt.of(j, Outcome.DONE) for j in jobs])
    assert len(reported) >= 5
    assert _scans_of_the_whole_table(reported) == []
