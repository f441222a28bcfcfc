"""The archiver: capped batches, no job lost or doubled while workers claim."""

from __future__ import annotations

import dataclasses
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from rota import archive, handlers, sql
from rota.archive import Archiver, ArchiveSettings
from rota.enqueue import enqueue
from rota.errors import InvalidInput, Permanent
from rota.jobs import Job
from rota.scheduler import Scheduler

Conn = psycopg.Connection[Any]
NOW = datetime(2026, 5, 1, tzinfo=UTC)


def finished(
    conn: Conn, status: str, age: timedelta, count: int = 1, now: datetime | None = NOW
) -> None:
    conn.execute(
        "INSERT INTO rota.job (type, status, finished_at, attempts)"
        " SELECT 't', %s, coalesce(%s, now()) - %s, 1 FROM generate_series(1, %s)",
        (status, now, age, count),
    )


def count(conn: Conn, table: str, status: str | None = None) -> int:
    query = {
        "job": "SELECT count(*) AS n FROM rota.job WHERE status = coalesce(%s, status)",
        "archive": "SELECT count(*) AS n FROM rota.job_archive WHERE status = coalesce(%s, status)",
    }[table]
    row = conn.execute(query, (status,)).fetchone()  # type: ignore[call-overload]
    return int(row["n"])


def test_moves_by_status_and_retention_in_batches(conn: Conn) -> None:
    finished(conn, "done", timedelta(days=8), count=25)
    finished(conn, "done", timedelta(days=6), count=3)
    finished(conn, "failed", timedelta(days=8), count=2)
    finished(conn, "dead", timedelta(days=31), count=4)
    conn.execute("INSERT INTO rota.job (type) VALUES ('t')")  # ready, never touched
    result = Archiver(ArchiveSettings(batch_size=10)).run_once(conn, now=NOW)
    assert (result.done, result.failed, result.batches, result.capped) == (25, 4, 4, False)
    assert count(conn, "job", "done") == 3
    assert count(conn, "job", "failed") == 2
    assert count(conn, "job", "ready") == 1
    assert count(conn, "archive", "dead") == 4
    row = conn.execute("SELECT archived_at FROM rota.job_archive LIMIT 1").fetchone()
    assert row is not None and row["archived_at"] == NOW


def test_max_batches_caps_a_run(conn: Conn) -> None:
    finished(conn, "done", timedelta(days=8), count=50)
    settings = ArchiveSettings(batch_size=10, max_batches=2)
    result = Archiver(settings).run_once(conn, now=NOW)
    assert (result.done, result.batches, result.capped) == (20, 2, True)
    assert count(conn, "job", "done") == 30


def test_archived_rows_are_deleted_after_the_archive_retention(conn: Conn) -> None:
    earlier, later = NOW - timedelta(days=40), NOW - timedelta(days=10)
    finished(conn, "done", timedelta(days=8), count=5, now=earlier)
    Archiver().run_once(conn, now=earlier)
    finished(conn, "dead", timedelta(days=31), count=3, now=later)
    Archiver().run_once(conn, now=later)
    assert count(conn, "archive") == 8
    kept = Archiver().run_once(conn, now=NOW)  # no archive retention: kept for good
    assert kept.deleted == 0 and count(conn, "archive") == 8
    settings = ArchiveSettings(archive_retention_seconds=30 * 86400, batch_size=2)
    result = Archiver(settings).run_once(conn, now=NOW)
    # One statement each for the done and the failed rows (none), three deleting 2, 2, 1.
    assert (result.count, result.deleted, result.batches, result.capped) == (0, 5, 5, False)
    assert count(conn, "archive", "done") == 0
    assert count(conn, "archive", "dead") == 3


def test_archived_children_stay_while_their_parent_is_in_the_job_table(conn: Conn) -> None:
    """A parent that ended dead or failed may be retried (`rota dead retry`), and
    its next run reads its children's outcomes again: they stay in the archive
    while it is in rota.job, whatever its status, and go once it has left."""
    finished(conn, "dead", timedelta(days=1))
    parent = conn.execute("SELECT id FROM rota.job").fetchone()["id"]  # type: ignore[index]
    conn.execute(
        "INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts,"
        "                              max_attempts, created_at, archived_at, parent_id)"
        " SELECT 1000 + g, 't', '{}', 'done', %(at)s, 1, 3, %(at)s, %(at)s, %(parent)s"
        " FROM generate_series(1, 2) AS g",
        {"at": NOW - timedelta(days=60), "parent": parent},
    )
    settings = ArchiveSettings(
        archive_retention_seconds=30 * 86400, failed_retention_seconds=90 * 86400
    )
    assert Archiver(settings).run_once(conn, now=NOW).deleted == 0
    assert count(conn, "archive") == 2
    conn.execute("DELETE FROM rota.job WHERE id = %s", (parent,))
    assert Archiver(settings).run_once(conn, now=NOW).deleted == 2


def test_max_batches_counts_the_deletions_too(conn: Conn) -> None:
    earlier = NOW - timedelta(days=40)
    finished(conn, "done", timedelta(days=8), count=4, now=earlier)
    Archiver().run_once(conn, now=earlier)
    finished(conn, "done", timedelta(days=8), count=3)
    settings = ArchiveSettings(archive_retention_seconds=86400, batch_size=2, max_batches=3)
    first = Archiver(settings).run_once(conn, now=NOW)
    # Moving 2 and 1 done rows, then no failed ones, uses the three statements.
    assert (first.done, first.deleted, first.batches, first.capped) == (3, 0, 3, True)
    second = Archiver(dataclasses.replace(settings, max_batches=10)).run_once(conn, now=NOW)
    assert (second.done, second.deleted, second.capped) == (0, 4, False)
    assert count(conn, "archive") == 3  # archived just now, within the retention


def test_deleting_archived_rows_walks_the_archive_by_index(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts,"
        " max_attempts, created_at, archived_at)"
        " SELECT -g, 't', '{}', 'done', now(), 1, 3, now(), now() - g * interval '1 minute'"
        " FROM generate_series(1, 50000) AS g"
    )
    conn.execute("ANALYZE rota.job_archive")
    plan = generic_plan(conn, "delete_archived")
    assert "Seq Scan" not in plan, plan
    assert "job_archive_archived_idx" in plan and "job_archive_pkey" in plan, plan
    assert "Scan using job_pkey" in plan, plan  # a child's parent, by its id


def test_deleting_expired_unique_keys_walks_the_keys_by_index(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO rota.job_unique_key (key, job_id, until)"
        " SELECT 'k' || g, g, now() + (g - 25000) * interval '1 minute'"
        " FROM generate_series(1, 50000) AS g"
    )
    conn.execute("ANALYZE rota.job_unique_key")
    plan = generic_plan(conn, "delete_expired_unique_keys")
    # Walked in window order up to the batch's LIMIT: no sort nor hash of every
    # expired key, and the schedules asked about a schedule's key only.
    assert "Seq Scan on job_unique_key" not in plan, plan
    assert "Sort" not in plan and "Hash" not in plan, plan
    assert "job_unique_key_until_idx" in plan and "job_unique_key_pkey" in plan, plan


def generic_plan(conn: Conn, query: str) -> str:
    """EXPLAIN of the named query as planned for any values of its parameters."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    statement = re.sub(r"%\((\w+)\)s", number, sql.query(query))
    rows = conn.execute("EXPLAIN (GENERIC_PLAN) " + statement).fetchall()
    return "\n".join(r["QUERY PLAN"] for r in rows)


def test_no_job_lost_or_doubled_while_workers_claim(db_url: str, conn: Conn) -> None:
    conn.execute("INSERT INTO rota.job (type) SELECT 't' FROM generate_series(1, 3000)")
    finished(conn, "done", timedelta(days=1), count=2000)
    total = 5000
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        claim = (
            "WITH p AS (SELECT id FROM rota.job WHERE status = 'ready' ORDER BY id LIMIT 25"
            " FOR UPDATE SKIP LOCKED) UPDATE rota.job j SET status = 'running',"
            " attempts = attempts + 1, started_at = now() FROM p WHERE j.id = p.id RETURNING j.id"
        )
        done = "UPDATE rota.job SET status = 'done', finished_at = now() WHERE id = ANY(%s)"
        try:
            with psycopg.connect(db_url, autocommit=True) as c:
                while ids := [r[0] for r in c.execute(claim).fetchall()]:
                    c.execute(done, (ids,))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def archiver() -> None:
        settings = ArchiveSettings(done_retention_seconds=0, batch_size=100, max_batches=3)
        try:
            while not stop.is_set():
                Archiver(settings).run_once(db_url)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=worker) for _ in range(3)]
    arch = threading.Thread(target=archiver)
    arch.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    stop.set()
    arch.join(timeout=60)
    assert not errors
    Archiver(ArchiveSettings(done_retention_seconds=0)).run_once(conn)
    live = {r["id"] for r in conn.execute("SELECT id FROM rota.job").fetchall()}
    archived = [r["id"] for r in conn.execute("SELECT id FROM rota.job_archive").fetchall()]
    assert live == set()
    assert len(archived) == len(set(archived)) == total
    assert count(conn, "archive", "done") == total
    attempts = conn.execute("SELECT max(attempts) AS m FROM rota.job_archive").fetchone()
    assert attempts is not None and attempts["m"] == 1  # no job was claimed twice


def test_an_archived_key_may_be_used_again(conn: Conn) -> None:
    first = enqueue(conn, "t", {"n": 1}, key="order-42")
    assert enqueue(conn, "t", {"n": 2}, key="order-42") == first  # inside the window
    conn.execute(
        "UPDATE rota.job SET status = 'done', finished_at = %s WHERE id = %s",
        (NOW - timedelta(days=8), first),
    )
    Archiver().run_once(conn, now=NOW)
    second = enqueue(conn, "t", {"n": 3}, key="order-42")
    assert second != first
    row = conn.execute("SELECT status, payload FROM rota.job WHERE id = %s", (second,)).fetchone()
    assert row == {"status": "ready", "payload": {"n": 3}}


def test_builtin_schedule_enqueues_the_archive_job(conn: Conn) -> None:
    later = datetime(2035, 1, 1, tzinfo=UTC)
    conn.execute(
        "UPDATE rota.schedule SET suspend = false, next_run_at = %s",
        (later + timedelta(minutes=5),),
    )
    scheduler = Scheduler()
    scheduler.run_once(conn, now=later + timedelta(minutes=1))
    scheduler.run_once(conn, now=later + timedelta(minutes=5, seconds=1))
    job = conn.execute("SELECT type, slot, max_attempts FROM rota.job").fetchone()
    assert job == {"type": "rota.archive", "slot": later + timedelta(minutes=5), "max_attempts": 3}


def _job(payload: Any) -> Job:
    return Job.from_row(
        {
            "id": 1,
            "type": "rota.archive",
            "payload": payload,
            "idempotency_key": None,
            "status": "running",
            "run_at": NOW,
            "attempts": 1,
            "max_attempts": 3,
        }
    )


def test_handler_uses_the_payload_settings(db_url: str, conn: Conn) -> None:
    registered = handlers.registered()[archive.JOB_TYPE]
    assert registered.wants_context
    finished(conn, "done", timedelta(hours=2), count=3, now=None)  # the handler uses now()
    ctx = handlers.Context(dsn=db_url, worker_id="test")
    archive.archive_job(_job({"done_retention_seconds": 7200 + 3600}), ctx)
    assert count(conn, "job", "done") == 3
    archive.archive_job(_job({"done_retention_seconds": 60}), ctx)
    assert count(conn, "job", "done") == 0
    with pytest.raises(Permanent, match="archive"):
        archive.archive_job(_job({"retention": 1}), ctx)
    with pytest.raises(Permanent, match="negative"):
        archive.archive_job(_job({"done_retention_seconds": -1}), ctx)


def test_settings_are_validated() -> None:
    with pytest.raises(InvalidInput):
        ArchiveSettings(batch_size=0)
    with pytest.raises(InvalidInput, match="negative"):
        ArchiveSettings(archive_retention_seconds=-1)
    assert (
        ArchiveSettings.from_payload({"archive_retention_seconds": 60}).archive_retention_seconds
        == 60
    )
    assert ArchiveSettings.from_payload({"archive_retention_seconds": None}) == ArchiveSettings()
    off = ArchiveSettings.from_payload({"rebuild_bloated_indexes": False})
    assert not off.rebuild_bloated_indexes
    for payload, reason in [
        ({"done_retention_seconds": "7d"}, "done_retention_seconds must be a number of seconds"),
        ({"failed_retention_seconds": None}, "failed_retention_seconds must be a number"),
        ({"max_batches": True}, "max_batches must be a whole number"),
        ({"batch_size": 10.5}, "batch_size must be a whole number"),
        ({"rebuild_bloated_indexes": 1}, "rebuild_bloated_indexes must be true or false"),
    ]:
        with pytest.raises(InvalidInput, match=reason):
            ArchiveSettings.from_payload(payload)


def test_effect_markers_leave_with_their_job_so_a_reused_key_runs_its_effect(conn: Conn) -> None:
    from rota import lookup
    from rota.effects import record_effect

    first = lookup.get_job(conn, enqueue(conn, "t", key="order-7"))
    keyless = lookup.get_job(conn, enqueue(conn, "t"))
    kept = lookup.get_job(conn, enqueue(conn, "t", key="order-8"))
    for job in (first, keyless, kept):
        assert record_effect(conn, job, "charge")
    assert not record_effect(conn, first, "charge")  # a rerun of the same job skips it
    conn.execute(
        "UPDATE rota.job SET status = 'done', finished_at = %s WHERE id = ANY(%s)",
        (NOW - timedelta(days=8), [first.id, keyless.id]),
    )
    assert Archiver().run_once(conn, now=NOW).done == 2
    markers = conn.execute("SELECT job_key FROM rota.job_effect ORDER BY job_key").fetchall()
    assert [m["job_key"] for m in markers] == ["order-8"]
    # The key is free again: the new job's effect is not taken for the old one's.
    again = lookup.get_job(conn, enqueue(conn, "t", key="order-7"))
    assert again.id != first.id
    assert record_effect(conn, again, "charge")
    # A job deleted by hand takes its markers with it too.
    conn.execute("DELETE FROM rota.job WHERE id = %s", (again.id,))
    assert conn.execute("SELECT count(*) AS n FROM rota.job_effect").fetchone()["n"] == 1  # type: ignore[index]


def _index_pages(conn: Conn, name: str) -> int:
    row = conn.execute("SELECT pg_relation_size(%s::regclass) / 8192 AS pages", (name,)).fetchone()
    return int(row["pages"])  # type: ignore[index]


def _bloat(conn: Conn) -> None:
    """Indexes of many jobs, nearly all of them archived and vacuumed since: the
    entries are gone, the pages are not (as a long transaction leaves them)."""
    finished(conn, "done", timedelta(days=8), count=100_000)
    finished(conn, "done", timedelta(hours=1), count=100)
    result = Archiver(ArchiveSettings(max_batches=1000, rebuild_bloated_indexes=False)).run_once(
        conn, now=NOW
    )
    assert result.done == 100_000
    conn.execute("VACUUM ANALYZE rota.job")


def test_the_archiver_rebuilds_the_bloated_indexes_of_the_job_table(conn: Conn) -> None:
    _bloat(conn)
    before = _index_pages(conn, "rota.job_pkey")
    assert before >= archive.REBUILD_MIN_PAGES
    result = Archiver().run_once(conn, now=NOW)
    assert {"job_pkey", "job_type_idx"} <= set(result.rebuilt), result
    assert "rebuilt the bloated indexes" in str(result)
    assert _index_pages(conn, "rota.job_pkey") < before / 20
    # Every index valid and used as before; nothing left of the rebuild.
    rows = conn.execute(
        "SELECT c.relname, i.indisvalid FROM pg_index AS i JOIN pg_class AS c"
        " ON c.oid = i.indexrelid WHERE i.indrelid = 'rota.job'::regclass"
    ).fetchall()
    assert all(r["indisvalid"] for r in rows) and not any("_cc" in r["relname"] for r in rows)
    assert count(conn, "job", "done") == 100
    # Packed now: the next run leaves them alone.
    assert Archiver().run_once(conn, now=NOW).rebuilt == ()


def test_no_rebuild_while_an_old_transaction_holds_a_snapshot(
    conn: Conn, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bloat(conn)
    monkeypatch.setattr(archive, "REBUILD_QUIET_SECONDS", 0.0)
    with psycopg.connect(db_url) as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM rota.job").fetchone()
        result = Archiver().run_once(conn, now=NOW)  # would wait for `report` to end
    assert result.rebuilt == ()
    assert Archiver().run_once(conn, now=NOW).rebuilt != ()


def test_what_an_interrupted_rebuild_left_is_dropped(conn: Conn) -> None:
    conn.execute("CREATE INDEX job_pkey_ccnew ON rota.job (id)")
    conn.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'rota.job_pkey_ccnew'::regclass"
    )
    Archiver().run_once(conn, now=NOW)
    row = conn.execute("SELECT to_regclass('rota.job_pkey_ccnew') AS idx").fetchone()
    assert row is not None and row["idx"] is None


def _table_pages(conn: Conn) -> int:
    return _index_pages(conn, "rota.job")


def _grown_at_its_end(conn: Conn) -> None:
    """A table a long transaction left grown: its newest rows kept (at its start),
    the many jobs after them (at its end) archived since, the file as large."""
    conn.execute("ALTER TABLE rota.job SET (autovacuum_enabled = false)")  # this test's vacuum
    finished(conn, "done", timedelta(hours=1), count=100)
    finished(conn, "done", timedelta(days=8), count=50_000)
    conn.execute("ANALYZE rota.job")
    off = ArchiveSettings(max_batches=1000, rebuild_bloated_indexes=False)
    assert Archiver(off).run_once(conn, now=NOW).done == 50_000
    conn.execute("ANALYZE rota.job")


def test_the_archiver_vacuums_a_table_grown_far_past_its_rows_so_its_end_is_given_back(
    conn: Conn,
) -> None:
    _grown_at_its_end(conn)
    before = _table_pages(conn)
    assert before > 2 * archive.REBUILD_MIN_PAGES
    result = Archiver().run_once(conn, now=NOW)
    assert result.vacuumed and "vacuumed the bloated table" in str(result)
    assert _table_pages(conn) < before / 20
    assert count(conn, "job", "done") == 100
    # Its file fits its rows now: the next run leaves it to autovacuum.
    assert not Archiver().run_once(conn, now=NOW).vacuumed


def test_no_vacuum_while_an_old_transaction_holds_a_snapshot(
    conn: Conn, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _grown_at_its_end(conn)
    before = _table_pages(conn)
    monkeypatch.setattr(archive, "REBUILD_QUIET_SECONDS", 0.0)
    with psycopg.connect(db_url) as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM rota.job").fetchone()
        result = Archiver().run_once(conn, now=NOW)
    assert not result.vacuumed and _table_pages(conn) == before
    assert Archiver().run_once(conn, now=NOW).vacuumed


def test_no_vacuum_with_the_setting_off(conn: Conn) -> None:
    _grown_at_its_end(conn)
    off = ArchiveSettings(rebuild_bloated_indexes=False)
    assert not Archiver(off).run_once(conn, now=NOW).vacuumed
