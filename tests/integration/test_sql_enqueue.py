"""rota.enqueue(...) in SQL: from any client in its own transaction, and from a trigger."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rota
from rota import claim as claims

ROOT = Path(__file__).parents[2]
TRIGGER_EXAMPLE = ROOT / "examples" / "sql" / "trigger.sql"


def jobs(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM rota.job ORDER BY id").fetchall()  # type: ignore[return-value]


def test_the_defaults_make_the_row_rota_enqueue_makes(conn) -> None:
    from_sql = conn.execute("SELECT rota.enqueue('report') AS id").fetchone()["id"]
    from_python = rota.enqueue(conn, "report")
    rows = {r["id"]: r for r in jobs(conn)}
    differ = {"id", "created_at", "run_at"}
    assert {k: v for k, v in rows[from_sql].items() if k not in differ} == {
        k: v for k, v in rows[from_python].items() if k not in differ
    }
    assert rows[from_sql]["payload"] == {} and rows[from_sql]["max_attempts"] == 20


def test_every_argument_by_name_and_a_known_key(conn) -> None:
    at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    first = conn.execute(
        "SELECT rota.enqueue('email.send', payload => %s, key => 'k-1', run_at => %s,"
        " priority => 7, max_attempts => 4, group_key => 'tenant-3') AS id",
        (psycopg.types.json.Jsonb({"to": "a@example.com"}), at),
    ).fetchone()["id"]
    again = conn.execute("SELECT rota.enqueue('email.send', '{}', 'k-1') AS id").fetchone()["id"]
    assert again == first
    [row] = jobs(conn)
    assert (row["payload"], row["idempotency_key"], row["run_at"]) == (
        {"to": "a@example.com"},
        "k-1",
        at,
    )
    assert (row["priority"], row["max_attempts"], row["group_key"]) == (7, 4, "tenant-3")
    (claimed,) = claims.claim(conn, "w", 5, 30, now=at)  # a worker takes it like any job
    assert claimed.id == first


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("rota.enqueue('')", "job type must be a non-empty string"),
        ("rota.enqueue(NULL)", "job type must be a non-empty string"),
        ("rota.enqueue('t', priority => 10)", "priority must be a whole number from 0"),
        ("rota.enqueue('t', priority => NULL)", "priority must be a whole number from 0"),
        ("rota.enqueue('t', max_attempts => 0)", "max_attempts must be a whole number of at least"),
        ("rota.enqueue('t', key => '')", "an idempotency key must be a non-empty string"),
        (
            "rota.enqueue('t', jsonb_build_object('x', repeat('a', 300000)))",
            "over the limit of 262144 bytes",
        ),
    ],
)
def test_bad_arguments_raise_22023_and_write_nothing(conn, call: str, message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute(f"SELECT {call}")
    assert jobs(conn) == []


def test_the_job_lives_and_dies_with_the_callers_transaction(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT rota.enqueue('t', key => 'rolled-back')")
        conn.rollback()
        conn.execute("SELECT rota.enqueue('t', key => 'committed')")
        conn.commit()
        keys = [r[0] for r in conn.execute("SELECT idempotency_key FROM rota.job")]
    assert keys == ["committed"]


def test_the_documented_trigger_enqueues_a_job_per_committed_row(db_url: str) -> None:
    example = TRIGGER_EXAMPLE.read_text()
    assert example.strip() in (ROOT / "docs" / "integrations.md").read_text()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(example)
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO app_user (email) VALUES ('a@example.com')")
        conn.commit()
        conn.execute("INSERT INTO app_user (email) VALUES ('b@example.com')")
        conn.rollback()
        conn.execute("INSERT INTO app_user (email) VALUES ('c@example.com')")
        conn.commit()
        rows = conn.execute(
            "SELECT type, payload, idempotency_key, priority FROM rota.job ORDER BY id"
        ).fetchall()
    assert rows == [
        ("email.welcome", {"user_id": 1, "email": "a@example.com"}, "welcome:1", 3),
        ("email.welcome", {"user_id": 3, "email": "c@example.com"}, "welcome:3", 3),
    ]


def _confirmed_insertions(conn: psycopg.Connection[Any], enqueue: Callable[[], object]) -> int:
    """The speculative insertions into rota.job that `enqueue` wrote, read in the WAL:
    an insert under ON CONFLICT writes its row, then a second record confirming it."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error as exc:  # a server without the contrib module, or no right to it
        pytest.skip(f"pg_walinspect: {exc}")
    readable = conn.execute(
        "SELECT CASE WHEN to_regprocedure('pg_get_wal_block_info(pg_lsn, pg_lsn, boolean)')"
        " IS NULL THEN false ELSE has_function_privilege("
        "'pg_get_wal_block_info(pg_lsn, pg_lsn, boolean)', 'EXECUTE') END AS ok"
    ).fetchone()["ok"]
    if not readable:  # PostgreSQL before 16, or a role without pg_read_server_files
        pytest.skip("pg_get_wal_block_info is not there to read the WAL with")
    conn.execute("SET synchronous_commit = on")  # each commit flushes what it wrote
    start = conn.execute("SELECT pg_current_wal_insert_lsn() AS lsn").fetchone()["lsn"]
    enqueue()
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE record_type = 'HEAP_CONFIRM') AS confirms,"
        " count(*) FILTER (WHERE record_type LIKE 'INSERT%%') AS inserts"
        " FROM pg_get_wal_block_info(%s, pg_current_wal_flush_lsn())"
        " WHERE reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database())"
        "   AND relfilenode = pg_relation_filenode('rota.job')",
        (start,),
    ).fetchone()
    assert row["inserts"] >= 1  # the job was written, and read back here
    return int(row["confirms"])


def test_a_job_without_a_key_is_inserted_without_arbitration_at_every_door(conn) -> None:
    # No row can conflict with a job that has no key, so no door inserts it
    # speculatively (the confirming record is 48 bytes of WAL a job); a key
    # still goes through ON CONFLICT, which must hold it against a rival.
    assert _confirmed_insertions(conn, lambda: conn.execute("SELECT rota.enqueue('t')")) == 0
    assert _confirmed_insertions(conn, lambda: rota.enqueue(conn, "t")) == 0
    batch = [rota.NewJob("t"), rota.NewJob("t", group="g")]
    assert _confirmed_insertions(conn, lambda: rota.enqueue_many(conn, batch)) == 0
    keyed = "SELECT rota.enqueue('t', key => 'k-1')"
    assert _confirmed_insertions(conn, lambda: conn.execute(keyed)) == 1
    assert _confirmed_insertions(conn, lambda: rota.enqueue(conn, "t", key="k-2")) == 1
