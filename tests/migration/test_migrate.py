"""Migrations: forward-only, recorded, and safe when many processes run them at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
from rota import claim as claims
from rota import sql
from rota.errors import MigrationError
from rota.migrate import applied, migrate, require_current


def test_concurrent_migrate_processes_apply_each_migration_once(empty_db_url: str) -> None:
    env = dict(os.environ, ROTA_DATABASE_URL=empty_db_url)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "rota", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(5)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 5, outputs
    known = [n for n, _, _ in sql.migrations()]
    assert applied(empty_db_url) == known
    # The advisory lock serialises the processes: each migration is applied by
    # exactly one of them (which one may differ from migration to migration).
    counts = [int(out.split()[1]) for out, _ in outputs]
    assert sum(counts) == len(known)


def test_migrate_twice_is_a_no_op_and_schema_is_complete(empty_db_url: str) -> None:
    with pytest.raises(MigrationError, match="rota migrate"):
        require_current(empty_db_url)
    assert migrate(empty_db_url) == [n for n, _, _ in sql.migrations()]
    assert migrate(empty_db_url) == []
    require_current(empty_db_url)
    with psycopg.connect(empty_db_url) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'rota'"
            )
        }
        columns = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'rota' AND table_name = 'job'"
            )
        }
    assert {"job", "schedule", "migrations", "lease_expiration", "job_effect"} <= tables
    assert {
        "id",
        "type",
        "payload",
        "idempotency_key",
        "status",
        "run_at",
        "attempts",
        "max_attempts",
        "locked_by",
        "locked_until",
        "last_error",
        "created_at",
        "started_at",
        "finished_at",
        "schedule_id",
        "slot",
    } <= columns


def test_claiming_uses_the_ready_index_among_many_done_rows(conn: psycopg.Connection) -> None:  # type: ignore[type-arg]
    conn.execute(
        "INSERT INTO rota.job (type, status, finished_at)"
        " SELECT 't', 'done', now() FROM generate_series(1, 100000)"
    )
    conn.execute("INSERT INTO rota.job (type) SELECT 't' FROM generate_series(1, 10)")
    conn.execute("ANALYZE rota.job")
    plan = conn.execute(
        "EXPLAIN " + sql.query("claim_jobs"), claims._claim_params("w", 10, 30, None, None)
    ).fetchall()
    text = "\n".join(str(next(iter(r.values()))) for r in plan)
    # job_claim_idx replaced job_ready_idx in migration 0004 (priorities).
    assert "job_claim_idx" in text or "job_ready_type_idx" in text, text
    assert not re.search(r"Seq Scan on job\b", text), text  # job_limit is a small table


def test_windows_past_ten_years_become_ten_years_and_claims_go_on(empty_db_url: str) -> None:
    # Migration 0036 puts a CHECK on a rate's window; rows written before it with
    # a window no claim could count (every claim failed on them) take the
    # longest window there is, the one that lets the fewest jobs start.
    with psycopg.connect(empty_db_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(sql.query("migrate_bootstrap"))
        for number, name, text in sql.migrations():
            if number < 36:
                conn.execute(text.encode())
                conn.execute(sql.query("migration_record"), {"id": number, "name": name})
        conn.execute(
            "INSERT INTO rota.job_limit (type, rate, per_seconds)"
            " VALUES ('inf', 1, 'Infinity'), ('nan', 1, 'NaN'), ('ok', 1, 60)"
        )
        assert migrate(conn) == [36]
        windows = conn.execute("SELECT type, per_seconds FROM rota.job_limit ORDER BY type")
        assert windows.fetchall() == [
            {"type": "inf", "per_seconds": 315360000.0},
            {"type": "nan", "per_seconds": 315360000.0},
            {"type": "ok", "per_seconds": 60.0},
        ]
        for job_type in ("inf", "inf", "nan", "plain"):
            rota.enqueue(conn, job_type, {})
        assert sorted(j.type for j in claims.claim(conn, "w", 10, 60)) == ["inf", "nan", "plain"]
