"""What reading the limits' states costs beside many running jobs: `rota
status`, `rota limit list`, the exporter and every WorkerPool poll read them.
No index finds a type's running jobs, so a count per limit read every running
row once per limit (200 limits beside 4,000 running jobs: 800,000 rows); one
walk of the running rows counts them all."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import rota
from rota import flow
from tests.table_reads import rows_read

LIMITS = 200
RUNNING_PER_TYPE = 20


def _many_limits_beside_running_jobs(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO rota.job_limit (type, group_concurrency)"
        " SELECT 'grouped-' || i, 1 FROM generate_series(1, %s) AS i",
        (LIMITS // 2,),
    )
    conn.execute(
        "INSERT INTO rota.job_limit (type, concurrency)"
        " SELECT 'capped-' || i, %s FROM generate_series(1, %s) AS i",
        (RUNNING_PER_TYPE, LIMITS // 2),
    )
    # Every limit full: each type runs its share and has one due job waiting.
    conn.execute(
        "INSERT INTO rota.job (type, group_key, status, attempts, started_at, locked_by,"
        " locked_until)"
        " SELECT l.type, CASE WHEN l.group_concurrency IS NOT NULL THEN 'g' || n END,"
        " 'running', 1, now(), 'w', now() + interval '1 hour'"
        " FROM rota.job_limit AS l, generate_series(1, %s) AS n",
        (RUNNING_PER_TYPE,),
    )
    conn.execute(
        "INSERT INTO rota.job (type, group_key, run_at)"
        " SELECT l.type, CASE WHEN l.group_concurrency IS NOT NULL THEN 'g1' END,"
        " now() - interval '1 minute' FROM rota.job_limit AS l"
    )
    conn.execute("VACUUM ANALYZE rota.job")


def test_the_limits_states_read_each_running_job_once(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        _many_limits_beside_running_jobs(setup)
    with psycopg.connect(db_url) as conn:  # one transaction: its own counters
        states = rota.list_limits(conn)
        read = rows_read(conn)
        conn.rollback()
    assert len(states) == LIMITS
    assert {(s.running, s.due, s.held) for s in states} == {(RUNNING_PER_TYPE, 1, 1)}
    running = LIMITS * RUNNING_PER_TYPE
    assert read < 2 * running, read


def test_the_states_of_some_types_read_only_theirs(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        _many_limits_beside_running_jobs(setup)
    with psycopg.connect(db_url) as conn:
        states = rota.list_limits(conn, types=["grouped-7", "capped-3", "unlimited"])
        conn.rollback()
    assert [(s.type, s.running, s.held) for s in states] == [
        ("capped-3", RUNNING_PER_TYPE, 1),
        ("grouped-7", RUNNING_PER_TYPE, 1),
    ]


def test_types_given_as_one_string_are_refused_not_read_letter_by_letter(db_url: str) -> None:
    with pytest.raises(rota.InvalidInput, match="must be a list"):
        flow.list_limits(db_url, types="email")  # type: ignore[arg-type]
