"""What a limited claim reads on a big backlog: 1,000,000 ready jobs across
10,000 groups, the claim taken with a group limit. No sequential scan of the
job table and no sort of the set: index entries read stay bounded by the jobs
claimed and the groups visited, not by the backlog."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import rota
from rota import sql
from rota.claim import claim

JOBS = 1_000_000
GROUPS = 10_000
BATCH = 100


@pytest.fixture(scope="module")
def big_backlog(pg_server: Any, template_db: str) -> Iterator[str]:
    name = "rota_limit_plans"
    url = pg_server.create(name, template=template_db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            "INSERT INTO rota.job (type, group_key, run_at)"
            " SELECT 'export', 'customer-' || (n %% %s), now() - interval '1 hour'"
            " FROM generate_series(1, %s) AS n",
            (GROUPS, JOBS),
        )
        c.execute("VACUUM ANALYZE rota.job")
    yield url
    pg_server.drop(name)


def _reads_of(conn: psycopg.Connection[Any]) -> dict[str, int]:
    row = conn.execute(
        "SELECT seq_scan, seq_tup_read, idx_scan, idx_tup_fetch"
        " FROM pg_stat_xact_user_tables WHERE relid = 'rota.job'::regclass"
    ).fetchone()
    assert row is not None
    return dict(zip(["seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch"], row, strict=True))


@pytest.mark.parametrize(
    "limits",
    [
        {"group_concurrency": 1},
        {"concurrency": 50_000, "group_concurrency": 3},
        {"concurrency": 50_000},
    ],
)
def test_a_limited_claim_reads_a_bounded_part_of_a_million_jobs(
    big_backlog: str, limits: dict[str, int]
) -> None:
    with psycopg.connect(big_backlog, autocommit=True) as setup:
        setup.execute("TRUNCATE rota.job_limit")
        rota.set_limit(setup, "export", **limits)
    with psycopg.connect(big_backlog) as conn:  # one transaction: its own statistics
        try:
            for _ in range(3):  # the cursor moves on: later claims read as little
                jobs = claim(conn, "w", BATCH, 30)
                assert len(jobs) == BATCH
                if "group_concurrency" in limits:
                    per_group: dict[str | None, int] = {}
                    for job in jobs:
                        per_group[job.group_key] = per_group.get(job.group_key, 0) + 1
                    assert max(per_group.values()) <= limits["group_concurrency"]
            reads = _reads_of(conn)
        finally:
            conn.rollback()
    assert reads["seq_scan"] == 0, reads
    # 3 claims of 100: each visits ~100 groups, a few index probes apiece.
    assert reads["idx_tup_fetch"] < 20_000, reads


def test_the_group_walk_statements_never_sort(big_backlog: str) -> None:
    """The statements inside rota.pick_limited, planned generic as PL/pgSQL runs them."""
    statements = {
        "next group": "SELECT j.group_key FROM rota.job AS j"
        " WHERE j.status = 'ready' AND j.type = $1 AND j.group_key > $2"
        " ORDER BY j.group_key LIMIT 1",
        "first group": "SELECT j.group_key FROM rota.job AS j"
        " WHERE j.status = 'ready' AND j.type = $1 AND j.group_key IS NOT NULL"
        " ORDER BY j.group_key LIMIT 1",
        "jobs of a group": "SELECT c.id FROM generate_series(0, 9) AS p(priority)"
        " CROSS JOIN LATERAL (SELECT j.id FROM rota.job AS j"
        " WHERE j.status = 'ready' AND j.type = $1 AND j.group_key = $2"
        " AND j.priority = p.priority AND j.run_at <= $3 ORDER BY j.run_at, j.id"
        " LIMIT $4 FOR UPDATE SKIP LOCKED) AS c LIMIT $4",
        "jobs without a group, from a start": "SELECT c.id"
        " FROM generate_series(0, 9) AS p(priority)"
        " CROSS JOIN LATERAL (SELECT j.id FROM rota.job AS j"
        " WHERE j.status = 'ready' AND j.type = $1 AND j.group_key IS NULL"
        " AND j.priority = p.priority"
        " AND (j.run_at, j.id) >= (coalesce(($2::jsonb ->> p.priority)::timestamptz,"
        " '-infinity'), 0)"
        " AND j.run_at <= $3 ORDER BY j.group_key, j.run_at, j.id"
        " LIMIT $4 FOR UPDATE SKIP LOCKED) AS c LIMIT $4",
    }
    with psycopg.connect(big_backlog, autocommit=True) as conn:
        for what, text in statements.items():
            [(plan,)] = conn.execute(
                "EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + text  # type: ignore[operator]
            ).fetchall()
            shown = json.dumps(plan)
            assert '"Sort"' not in shown, (what, shown)
            assert "Seq Scan" not in shown, (what, shown)
            assert "job_group_ready_idx" in shown, (what, shown)


LONG_TYPE = "billing.invoices.send_overdue_payment_reminder_email"


@pytest.fixture(scope="module")
def backlog_after_statistics(pg_server: Any, template_db: str) -> Iterator[str]:
    """Jobs without a group of a limited type, ready after the statistics were
    taken: those saw a table of finished jobs (the history Rota keeps), with
    nothing ready. The type's name is long, as names with a domain and a verb
    are: the group index's entries are wider than the claim index's."""
    name = "rota_limit_plans_stale"
    url = pg_server.create(name, template=template_db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ALTER TABLE rota.job SET (autovacuum_enabled = false)")  # the statistics stay
        c.execute(
            "INSERT INTO rota.job (type, status, run_at, attempts, started_at, finished_at)"
            " SELECT %s, 'done', now() - interval '2 hours', 1,"
            " now() - interval '2 hours', now() - interval '2 hours'"
            " FROM generate_series(1, 50000)",
            (LONG_TYPE,),
        )
        c.execute("VACUUM ANALYZE rota.job")
        c.execute(
            "INSERT INTO rota.job (type, run_at)"
            " SELECT %s, now() - interval '1 hour' FROM generate_series(1, 20000)",
            (LONG_TYPE,),
        )
        rota.set_limit(c, LONG_TYPE, concurrency=50_000)  # one that never binds here
    yield url
    pg_server.drop(name)


def test_a_claim_walks_jobs_without_a_group_in_order_whatever_the_statistics(
    backlog_after_statistics: str,
) -> None:
    # Planned from statistics that saw nothing ready, the walk of the jobs
    # without a group took the claim index and sorted every ready job of the
    # priority for each claim: 179,400 index rows for these three.
    with psycopg.connect(backlog_after_statistics) as conn:
        try:
            # As the worker's steady claim plans (rota.claim._STEADY).
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            for _ in range(3):
                assert len(claim(conn, "w", BATCH, 30)) == BATCH
            reads = _reads_of(conn)
        finally:
            conn.rollback()
    assert reads["seq_scan"] == 0, reads
    assert reads["idx_tup_fetch"] < 2_000, reads


def test_the_floor_probe_finds_the_first_job_without_a_group_in_order(
    backlog_after_statistics: str,
) -> None:
    # The worker's floor probe asks the same walk for its first job: sorted,
    # it read every ready job of the type once a second.
    with psycopg.connect(backlog_after_statistics) as conn:
        try:
            before = _reads_of(conn)
            rows = conn.execute(sql.query("limited_floor"), {"types": None, "now": None}).fetchall()
            reads = _reads_of(conn)
        finally:
            conn.rollback()
    assert [(t, p) for t, p, _ in rows] == [(LONG_TYPE, 0)]
    assert reads["idx_tup_fetch"] - before["idx_tup_fetch"] < 100, (before, reads)
