"""Migrations: forward-only, recorded, and safe when many processes run them at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
from rota import claim as claims
from rota import sql
from rota.cli import main
from rota.errors import MigrationError
from rota.migrate import applied, migrate, require_current
from rota.scheduler import Scheduler


def _migrated_before(conn: psycopg.Connection[Any], number: int) -> None:
    """The migrations before `number` applied and recorded, as a database that
    stopped at that release has them."""
    conn.execute(sql.query("migrate_bootstrap"))
    for each, name, text in sql.migrations():
        if each < number:
            conn.execute(text.encode())
            conn.execute(sql.query("migration_record"), {"id": each, "name": name})


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


def test_a_schema_a_newer_rota_migrated_is_said_and_still_used(
    empty_db_url: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # A newer Rota's migration, as after a rollback, or while old workers run
    # on during an upgrade: this code works on, and says what it does not know.
    migrate(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO rota.migrations (id, name) VALUES (9041, 'from_the_future')")
    with caplog.at_level("WARNING", logger="rota.migrate"):
        require_current(empty_db_url)
    assert any("9041" in r.getMessage() and "newer" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("ROTA_DATABASE_URL", empty_db_url)
    assert main(["migrate"]) == 0  # (it configures logging: after the log is read)
    out = capsys.readouterr().out
    assert "applied 0 migration(s)" in out
    assert "[9041]" in out and "newer" in out, out


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
        _migrated_before(conn, 36)
        conn.execute(
            "INSERT INTO rota.job_limit (type, rate, per_seconds)"
            " VALUES ('inf', 1, 'Infinity'), ('nan', 1, 'NaN'), ('ok', 1, 60)"
        )
        assert migrate(conn) == [n for n, _, _ in sql.migrations() if n >= 36]
        windows = conn.execute("SELECT type, per_seconds FROM rota.job_limit ORDER BY type")
        assert windows.fetchall() == [
            {"type": "inf", "per_seconds": 315360000.0},
            {"type": "nan", "per_seconds": 315360000.0},
            {"type": "ok", "per_seconds": 60.0},
        ]
        for job_type in ("inf", "inf", "nan", "plain"):
            rota.enqueue(conn, job_type, {})
        assert sorted(j.type for j in claims.claim(conn, "w", 10, 60)) == ["inf", "nan", "plain"]


def test_schedules_stored_before_0037_stay_and_pass_their_slots(empty_db_url: str) -> None:
    # Migration 0037 checks a schedule's cron expression, group, timeout, window
    # and next run. Rows stored before it that break those rules stay as they
    # are (a trigger does not look back); the scheduler still moves them past
    # their slots (its advance changes next_run_at alone) and fires the others.
    now = datetime(2030, 1, 1, 12, tzinfo=UTC)
    with psycopg.connect(empty_db_url, autocommit=True, row_factory=dict_row) as conn:
        _migrated_before(conn, 37)
        conn.execute(
            "INSERT INTO rota.schedule (name, job_type, cron, next_run_at, group_key,"
            "                           timeout_seconds, unique_for_seconds)"
            " VALUES ('bad1', 't', 'garbage', %(due)s, NULL, NULL, NULL),"
            "        ('bad3', 't', '* * * * *', %(due)s, '', 'Infinity', NULL),"
            "        ('nan', 't', '* * * * *', %(due)s, NULL, 'NaN', 'NaN'),"
            "        ('never', 't', '* * * * *', 'infinity', NULL, NULL, NULL),"
            "        ('good', 't', '* * * * *', %(due)s, NULL, NULL, NULL)",
            {"due": now - timedelta(minutes=1)},
        )
        assert migrate(conn) == [n for n, _, _ in sql.migrations() if n >= 37]
        Scheduler().run_once(conn, now=now)
        rows = conn.execute(
            "SELECT s.name, s.next_run_at > %s AS ahead, count(j.id) AS jobs"
            " FROM rota.schedule AS s LEFT JOIN rota.job AS j ON j.schedule_id = s.id"
            " WHERE s.name <> 'rota/archive' GROUP BY s.name, s.next_run_at ORDER BY s.name",
            (now,),
        ).fetchall()
        assert rows == [
            {"name": "bad1", "ahead": True, "jobs": 0},
            {"name": "bad3", "ahead": True, "jobs": 0},
            {"name": "good", "ahead": True, "jobs": 1},
            {"name": "nan", "ahead": True, "jobs": 0},
            {"name": "never", "ahead": True, "jobs": 0},
        ]


def test_waits_ended_by_event_before_0044_take_the_payload_still_there(empty_db_url: str) -> None:
    # Migration 0044 keeps the payload on a wait ended by 'event'. A wait that
    # ended before it takes its event's payload while the event is there, not
    # that of a key emitted anew since, and none once the event is gone.
    ended = datetime(2030, 1, 1, tzinfo=UTC)
    with psycopg.connect(empty_db_url, autocommit=True, row_factory=dict_row) as conn:
        _migrated_before(conn, 44)
        conn.execute(
            "INSERT INTO rota.job_event (key, payload, emitted_at)"
            " VALUES ('kept', '{\"n\": 1}', %(before)s), ('bare', NULL, %(before)s),"
            "        ('anew', '{\"n\": 2}', %(after)s), ('open', '{\"n\": 3}', %(after)s)",
            {"before": ended - timedelta(hours=1), "after": ended + timedelta(hours=1)},
        )
        conn.execute(
            "INSERT INTO rota.job_wait (job_id, name, kind, event_key, started_at, ended_at,"
            "                           ended_by)"
            " SELECT 1, 'event:' || k, 'event', k, %(ended)s - interval '1 day', e, b"
            " FROM (VALUES ('kept', %(ended)s::timestamptz, 'event'),"
            "              ('bare', %(ended)s, 'event'), ('gone', %(ended)s, 'event'),"
            "              ('anew', %(ended)s, 'event'), ('open', NULL, NULL)) AS v(k, e, b)",
            {"ended": ended},
        )
        assert migrate(conn) == [n for n, _, _ in sql.migrations() if n >= 44]
        rows = conn.execute(
            "SELECT event_key, payload, payload IS NULL AS unknown FROM rota.job_wait"
            " ORDER BY event_key"
        ).fetchall()
    assert [(r["event_key"], r["payload"], r["unknown"]) for r in rows] == [
        ("anew", None, True),
        ("bare", None, False),
        ("gone", None, True),
        ("kept", {"n": 1}, False),
        ("open", None, True),
    ]


def test_children_archived_before_0038_take_their_parent_while_it_is_there(
    empty_db_url: str,
) -> None:
    # The archive keeps the archived children of a parent that has not ended, by
    # their parent_id; a child archived before 0038 has none, and takes it from
    # rota.job_child, whose rows stay while their parent is in rota.job.
    with psycopg.connect(empty_db_url, autocommit=True, row_factory=dict_row) as conn:
        _migrated_before(conn, 44)
        conn.execute(
            "INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts,"
            "                              max_attempts, created_at, archived_at)"
            " SELECT g, 't', '{}', 'done', now(), 1, 3, now(), now()"
            " FROM generate_series(2, 3) AS g"
        )
        conn.execute("INSERT INTO rota.job_child (parent_id, name, child_id) VALUES (1, '1', 2)")
        assert migrate(conn) == [n for n, _, _ in sql.migrations() if n >= 44]
        rows = conn.execute("SELECT id, parent_id FROM rota.job_archive ORDER BY id").fetchall()
    assert rows == [{"id": 2, "parent_id": 1}, {"id": 3, "parent_id": None}]
