"""`rota migrate --key-index`: idempotency keys unique by the constraint or by a
partial index over keyed rows, switched both ways while jobs keep coming."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
from rota import schedule_store
from rota.claim import Attempt, write_and_claim
from rota.errors import DatabaseError, InvalidInput
from rota.jobs import Outcome
from rota.migrate import applied, key_index, use_key_index
from rota.scheduler import Scheduler

# The module (rota.migrate is also the name of its function, in rota).
migrations = importlib.import_module("rota.migrate")

Conn = psycopg.Connection[Any]

BARE_INSERT = (
    "INSERT INTO rota.job (type, idempotency_key) VALUES ('t', %s)"
    " ON CONFLICT (idempotency_key) DO NOTHING"
)


def indexes(conn: Conn) -> dict[str, str]:
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes"
        " WHERE schemaname = 'rota' AND tablename = 'job' AND indexdef LIKE '%%idempotency_key%%'"
    ).fetchall()
    return {r["indexname"]: r["indexdef"] for r in rows}


def has_constraint(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT count(*) AS n FROM pg_constraint"
        " WHERE conrelid = 'rota.job'::regclass AND conname = 'job_idempotency_key_key'"
    ).fetchone()
    return bool(row and row["n"])


def index_entries(conn: Conn, name: str) -> int:
    """Entries of an index as VACUUM counted them."""
    conn.execute("VACUUM rota.job")
    row = conn.execute("SELECT reltuples::bigint AS n FROM pg_class WHERE relname = %s", (name,))
    found = row.fetchone()
    assert found is not None
    return int(found["n"])


def test_the_schema_keeps_keys_unique_by_the_constraint(conn: Conn) -> None:
    assert key_index(conn) == "constraint"
    assert has_constraint(conn)
    assert list(indexes(conn)) == ["job_idempotency_key_key"]
    # Any statement may name the key alone as its conflict target.
    conn.execute(BARE_INSERT, ("k",))
    conn.execute(BARE_INSERT, ("k",))
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone() == {"n": 1}


def test_partial_index_keeps_keys_unique_and_holds_no_keyless_rows(conn: Conn) -> None:
    assert use_key_index(conn, "partial") is True
    assert key_index(conn) == "partial"
    assert not has_constraint(conn)
    (definition,) = indexes(conn).values()
    assert "UNIQUE INDEX job_idempotency_key_idx" in definition
    assert "WHERE (idempotency_key IS NOT NULL)" in definition

    # Every way Rota inserts jobs still finds an existing key.
    first = rota.enqueue(conn, "t", {}, key="k1")
    assert rota.enqueue(conn, "t", {}, key="k1") == first
    batch = rota.enqueue_many(
        conn,
        [
            rota.NewJob("t", {}, key="k1"),
            rota.NewJob("t", {}, key="k2"),
            rota.NewJob("t", {}, key="k2"),
            rota.NewJob("t", {}),
            rota.NewJob("t", {}),
        ],
    )
    assert batch[0] == first and batch[1] == batch[2] and len(set(batch)) == 4
    spec = schedule_store.ScheduleSpec(name="s", job_type="t", cron="0 * * * *")
    schedule_store.upsert(conn, spec, now=datetime(2026, 1, 1, 8, 30, tzinfo=UTC))
    for second in (1, 2):
        conn.execute("UPDATE rota.schedule SET next_run_at = '2026-01-01 09:00Z' WHERE name = 's'")
        Scheduler().run_once(conn, now=datetime(2026, 1, 1, 9, 0, second, tzinfo=UTC))
    assert conn.execute("SELECT count(*) AS n FROM rota.job WHERE slot IS NOT NULL").fetchone() == {
        "n": 1
    }
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO rota.job (type, idempotency_key) VALUES ('t', 'k1')")

    # Claims and outcomes of keyless jobs add no entry to it: only the keyed rows are in it.
    pending: list[Attempt] = []
    while True:
        _, jobs = write_and_claim(conn, "w1", pending, 2, 30, ["t"])
        if not jobs:
            break
        pending = [Attempt.of(job, Outcome.DONE) for job in jobs]
    counts = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'done') AS done,"
        " count(idempotency_key) AS keyed FROM rota.job"
    ).fetchone()
    assert counts == {"done": 5, "keyed": 3}  # k1, k2 and the slot's key
    assert index_entries(conn, "job_idempotency_key_idx") == 3

    # The price: a conflict target without the WHERE finds no arbiter.
    with pytest.raises(psycopg.errors.InvalidColumnReference):
        conn.execute(BARE_INSERT, ("k9",))


def test_switching_back_restores_the_constraint_and_each_switch_once(conn: Conn) -> None:
    rota.enqueue_many(conn, [rota.NewJob("t", {}, key=f"k{i}") for i in range(20)])
    assert use_key_index(conn, "partial") is True
    assert use_key_index(conn, "partial") is False
    assert use_key_index(conn, "constraint") is True
    assert use_key_index(conn, "constraint") is False
    assert key_index(conn) == "constraint"
    assert has_constraint(conn)
    assert list(indexes(conn)) == ["job_idempotency_key_key"]
    conn.execute(BARE_INSERT, ("k3",))
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone() == {"n": 20}


def test_a_leftover_of_an_interrupted_switch_is_cleared_by_the_next(conn: Conn) -> None:
    use_key_index(conn, "partial")
    # What a switch back stopped during its build leaves: the constraint's index-to-be.
    conn.execute("CREATE UNIQUE INDEX job_idempotency_key_new ON rota.job (idempotency_key)")
    assert use_key_index(conn, "partial") is True
    assert list(indexes(conn)) == ["job_idempotency_key_idx"]


def test_a_switch_back_that_could_not_lock_the_table_reuses_its_index(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_key_index(conn, "partial")
    monkeypatch.setattr(migrations, "_LOCK_TRIES", 1)
    with psycopg.connect(db_url) as reader:
        reader.execute("SELECT count(*) FROM rota.job")  # holds its lock until rolled back
        with pytest.raises(DatabaseError, match="run the same command again"):
            use_key_index(conn, "constraint")
        reader.rollback()
    built = conn.execute(
        "SELECT oid FROM pg_class WHERE relname = 'job_idempotency_key_new'"
    ).fetchone()
    assert built is not None
    assert use_key_index(conn, "constraint") is True
    # The index built by the first try became the constraint's (renamed, not rebuilt).
    became = conn.execute(
        "SELECT oid FROM pg_class WHERE relname = 'job_idempotency_key_key'"
    ).fetchone()
    assert became == built
    assert list(indexes(conn)) == ["job_idempotency_key_key"]


def test_jobs_keep_coming_while_the_keys_switch_both_ways(db_url: str, conn: Conn) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()
    sent = 0

    def enqueue_forever() -> None:
        nonlocal sent
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as producer:  # type: ignore[arg-type]
            while not stop.is_set():
                try:
                    keys = [f"k{(sent + i) % 300}" for i in range(10)]
                    rota.enqueue_many(producer, [rota.NewJob("t", {}, key=k) for k in keys])
                    rota.enqueue(producer, "t", {})
                    sent += 10
                except BaseException as exc:
                    errors.append(exc)
                    return

    producer = threading.Thread(target=enqueue_forever)
    producer.start()
    try:
        for kind in ("partial", "constraint", "partial", "constraint"):
            assert use_key_index(db_url, kind) is True
    finally:
        stop.set()
        producer.join(60)
    assert errors == []
    assert sent > 0
    row = conn.execute(
        "SELECT count(idempotency_key) AS keyed, count(DISTINCT idempotency_key) AS keys"
        " FROM rota.job"
    ).fetchone()
    assert row == {"keyed": min(sent, 300), "keys": min(sent, 300)}


def test_two_switches_at_once_take_turns(db_url: str, conn: Conn) -> None:
    rota.enqueue_many(conn, [rota.NewJob("t", {}, key=f"k{i}") for i in range(2000)])
    results: list[bool] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def switch() -> None:
        start.wait()
        try:
            results.append(use_key_index(db_url, "partial"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=switch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sorted(results) == [False, True]
    assert key_index(conn) == "partial"


def test_a_switch_that_cannot_lock_the_table_says_so_and_can_be_run_again(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrations, "_LOCK_TRIES", 1)
    with psycopg.connect(db_url) as reader:
        reader.execute("SELECT count(*) FROM rota.job")  # holds its lock until rolled back
        with pytest.raises(DatabaseError, match=r"could not lock rota\.job") as raised:
            use_key_index(conn, "partial")
        assert "\n" not in str(raised.value)
        # Keys stay unique by the constraint; the new index waits, built.
        assert key_index(conn) == "constraint"
        assert set(indexes(conn)) == {"job_idempotency_key_key", "job_idempotency_key_idx"}
        reader.rollback()
    assert use_key_index(conn, "partial") is True
    assert list(indexes(conn)) == ["job_idempotency_key_idx"]


def test_a_switch_needs_an_autocommit_connection(db_url: str) -> None:
    with psycopg.connect(db_url) as conn, pytest.raises(InvalidInput, match="autocommit"):
        use_key_index(conn, "partial")
    with pytest.raises(InvalidInput, match="constraint, partial"):
        use_key_index(db_url, "full")


def test_rota_migrate_key_index(empty_db_url: str) -> None:
    env = dict(os.environ, ROTA_DATABASE_URL=empty_db_url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "rota", "migrate", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    refused = run("--key-index", "full")
    assert refused.returncode == 2
    assert "invalid choice: 'full'" in refused.stderr
    assert refused.stdout == ""
    assert applied(empty_db_url) == []  # nothing written

    switched = run("--key-index", "partial")
    assert switched.returncode == 0, switched.stderr
    assert switched.stdout.splitlines()[-1] == (
        "idempotency keys: partial unique index job_idempotency_key_idx (switched)"
    )
    again = run("--key-index", "partial")
    assert again.stdout.splitlines() == [
        "applied 0 migration(s)",
        "idempotency keys: partial unique index job_idempotency_key_idx (already)",
    ]
    # A plain migrate leaves the choice alone.
    assert run().returncode == 0
    assert key_index(empty_db_url) == "partial"
    back = run("--key-index", "constraint")
    assert back.stdout.splitlines()[-1] == (
        "idempotency keys: unique constraint job_idempotency_key_key (switched)"
    )
