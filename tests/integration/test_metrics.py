"""Every measure of rota.metrics against a database state built for it.

Jobs are inserted with plain SQL so each test states exactly the rows it
measures; the clock is frozen through `now`. The last test proves the queries
stay cheap: on a table of 200,000 done rows no plan reads rota.job sequentially.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict

from rota import claim as claims
from rota import metrics, sql, workers
from rota.claim import Attempt
from rota.jobs import Outcome, Status
from rota.metrics import (
    MetricsSettings,
    QueueCollector,
    queue_registry,
    record_outcome,
    worker_registry,
)
from rota.status import read_status as read_typed_status

NOW = datetime(2030, 3, 14, 15, 30, 0, tzinfo=UTC)
STATUSES = ("ready", "running", "done", "failed", "dead")


def read_status(conn: Any, now: datetime | None = None) -> dict[str, Any]:
    """The typed status as `rota status --json` shows it."""
    return read_typed_status(conn, now=now).to_json()


HOUR = datetime(2030, 3, 14, 15, 0, 0, tzinfo=UTC)


def add_job(
    conn: psycopg.Connection[Any],
    job_type: str,
    status: str,
    run_at: datetime = NOW,
    **columns: Any,
) -> None:
    names = ["type", "status", "run_at", *columns]
    values = [job_type, status, run_at, *columns.values()]
    placeholders = ", ".join(["%s"] * len(values))
    conn.execute(
        f"INSERT INTO rota.job ({', '.join(names)}) VALUES ({placeholders})",  # type: ignore[arg-type]
        values,
    )


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text parsed back: (sample name, labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def test_oldest_ready_age_counts_only_due_jobs_per_type(conn):
    add_job(conn, "email", "ready", NOW - timedelta(seconds=120))
    add_job(conn, "email", "ready", NOW - timedelta(seconds=30))
    add_job(conn, "email", "ready", NOW + timedelta(minutes=10))  # a retry waiting: not due
    add_job(conn, "report", "ready", NOW + timedelta(minutes=1))
    add_job(conn, "resize", "running", NOW - timedelta(hours=1))

    types = read_status(conn, now=NOW)["types"]

    assert types["email"]["oldest_ready_age_seconds"] == 120
    assert (types["email"]["ready"], types["email"]["due"]) == (3, 2)
    assert types["report"]["oldest_ready_age_seconds"] == 0
    assert (types["report"]["ready"], types["report"]["due"]) == (1, 0)
    assert types["resize"]["oldest_ready_age_seconds"] == 0


def test_jobs_by_status_and_type_running_and_dead(conn):
    for status, count in {"ready": 2, "running": 3, "done": 4, "failed": 1, "dead": 2}.items():
        for _ in range(count):
            add_job(conn, "email", status)
    add_job(conn, "report", "dead")
    add_job(conn, "report", "running")

    status = read_status(conn, now=NOW)

    email = status["types"]["email"]
    assert [email[s] for s in STATUSES] == [2, 3, 4, 1, 2]
    report = status["types"]["report"]
    assert [report[s] for s in STATUSES] == [0, 1, 0, 0, 1]
    assert status["dead_jobs"] == 3


def test_done_count_follows_every_way_in_and_out_of_done(conn):
    def done() -> dict[str, int]:
        return {t: m["done"] for t, m in read_status(conn, now=NOW)["types"].items() if m["done"]}

    for _ in range(3):
        add_job(conn, "email", "ready")
    add_job(conn, "sms", "done")  # inserted done
    assert done() == {"sms": 1}
    jobs = claims.claim(conn, "w", 3, 30.0, now=NOW)
    outcomes = [Outcome.DONE, Outcome.DONE, Outcome.FAILED]
    written = claims.write_outcomes(
        conn, "w", [Attempt.of(j, o) for j, o in zip(jobs, outcomes, strict=True)]
    )
    assert sorted(written.values()) == [Status.DONE, Status.DONE, Status.FAILED]
    assert done() == {"email": 2, "sms": 1}
    conn.execute("DELETE FROM rota.job WHERE type = 'email'")  # archived
    assert done() == {"sms": 1}
    conn.execute("TRUNCATE rota.job")
    assert done() == {}


def test_done_rows_written_by_hand_are_counted_again_on_request(conn):
    add_job(conn, "email", "ready")
    add_job(conn, "email", "done")
    conn.execute("UPDATE rota.job SET status = 'done' WHERE status = 'ready'")
    assert read_status(conn, now=NOW)["types"]["email"]["done"] == 1  # not seen
    assert conn.execute("SELECT rota.recount_done_jobs() AS n").fetchone()["n"] == 2
    assert read_status(conn, now=NOW)["types"]["email"]["done"] == 2


def test_done_count_sums_the_shards_of_many_connections(conn, db_url):
    for _ in range(5):
        with psycopg.connect(db_url, autocommit=True) as other:
            add_job(other, "email", "done")
    assert read_status(conn, now=NOW)["types"]["email"]["done"] == 5


def _done_counts(conn) -> tuple[int, dict[str, int]]:
    rows = conn.execute("SELECT type, count FROM rota.job_done_count").fetchall()
    totals: dict[str, int] = {}
    for row in rows:
        totals[row["type"]] = totals.get(row["type"], 0) + row["count"]
    return len(rows), totals


def test_done_counts_are_appended_never_updated_in_place(conn):
    # An update of a counter row makes a version that a transaction held open
    # elsewhere keeps: the next update walks every one of them. Appended rows
    # cost the same however long a snapshot is held.
    for _ in range(6):
        add_job(conn, "email", "ready")
    with conn.transaction():  # the counters read below are this transaction's
        for _ in range(3):
            jobs = claims.claim(conn, "w", 2, 30.0, now=NOW)
            done = [Attempt.of(j, Outcome.DONE) for j in jobs]
            claims.write_outcomes(conn, "w", done)
        add_job(conn, "email", "done")
        conn.execute("DELETE FROM rota.job WHERE id = (SELECT min(id) FROM rota.job)")
        updated = conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('rota.job_done_count'::regclass) AS n"
        ).fetchone()["n"]
    assert updated == 0
    rows, totals = _done_counts(conn)
    assert totals == {"email": 6} and rows == 5  # three outcome batches, an insert, a delete
    assert read_status(conn, now=NOW)["types"]["email"]["done"] == 6
    assert conn.execute("SELECT rota.fold_done_counts() AS n").fetchone()["n"] == 5
    assert _done_counts(conn) == (1, {"email": 6})
    assert read_status(conn, now=NOW)["types"]["email"]["done"] == 6


def test_a_fold_keeps_the_counts_appended_beside_it_and_beside_another_fold(conn, db_url):
    add_job(conn, "email", "done")
    add_job(conn, "sms", "done")
    with (
        psycopg.connect(db_url) as appending,
        psycopg.connect(db_url) as folding,
        psycopg.connect(db_url, autocommit=True) as other,
    ):
        add_job(appending, "email", "done")  # not committed while the folds run
        folding.execute("SELECT rota.fold_done_counts()")  # holds the rows it deleted
        # A second fold meets the first's deleted rows: it waits, then skips them.
        second = threading.Thread(target=other.execute, args=("SELECT rota.fold_done_counts()",))
        second.start()
        wait_for_lock_wait(conn)
        folding.commit()
        second.join(timeout=30)
        assert not second.is_alive()
        appending.commit()
    _, totals = _done_counts(conn)
    assert totals == {"email": 2, "sms": 1}
    conn.execute("SELECT rota.fold_done_counts()")
    assert _done_counts(conn) == (2, {"email": 2, "sms": 1})


def test_a_02_workers_upsert_of_its_shard_still_counts_beside_appended_rows(conn):
    # During an upgrade a 0.2 worker may still write outcomes after migration
    # 0016: its statement upserts shard pid % 16 with ON CONFLICT (type, shard).
    upsert = (
        "INSERT INTO rota.job_done_count (type, shard, count) VALUES ('email', 3, 1)"
        " ON CONFLICT (type, shard) DO UPDATE SET count = rota.job_done_count.count + 1"
    )
    add_job(conn, "email", "done")  # appended
    conn.execute(upsert)
    conn.execute(upsert)
    assert _done_counts(conn) == (2, {"email": 3})
    conn.execute("SELECT rota.fold_done_counts()")
    conn.execute(upsert)
    assert _done_counts(conn) == (2, {"email": 4})


def test_the_minute_sample_folds_the_done_counts(conn):
    for job_type in ("email", "email", "sms"):
        add_job(conn, job_type, "done")
    assert _done_counts(conn) == (3, {"email": 2, "sms": 1})
    assert workers.record_sample(conn, now=NOW)
    assert _done_counts(conn) == (2, {"email": 2, "sms": 1})
    assert not workers.record_sample(conn, now=NOW)  # the minute's writer folded


def wait_for_lock_wait(conn, deadline: float = 20.0) -> None:
    """Until another session of this database waits for a lock."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
        if row["n"]:
            return
        time.sleep(0.01)
    raise AssertionError("no session waited for a lock")


def test_lease_expirations_per_utc_hour(conn):
    for hours_ago, count in [(0, 3), (1, 5), (5, 2), (23, 1), (30, 7)]:
        conn.execute(
            "INSERT INTO rota.lease_expiration (hour, count) VALUES (%s, %s)",
            (HOUR - timedelta(hours=hours_ago), count),
        )

    leases = read_status(conn, now=NOW)["lease_expirations"]

    assert leases["total"] == 18
    assert (leases["current_hour"], leases["previous_hour"], leases["last_24h"]) == (3, 5, 11)
    assert [b["count"] for b in leases["by_hour"]] == [1, 2, 5, 3]
    assert leases["by_hour"][-1]["hour"] == HOUR.isoformat()


def test_lease_expirations_empty(conn):
    leases = read_status(conn, now=NOW)["lease_expirations"]
    assert leases == {
        "total": 0,
        "current_hour": 0,
        "previous_hour": 0,
        "last_24h": 0,
        "by_hour": [],
    }


def test_missed_slots_per_schedule(conn):
    for name, missed, skipped in [("ns/nightly", 3, 0), ("ns/hourly", 0, 2)]:
        conn.execute(
            "INSERT INTO rota.schedule (name, job_type, cron, next_run_at, missed_slots,"
            " skipped_slots) VALUES (%s, 'report', '0 * * * *', %s, %s, %s)",
            (name, NOW, missed, skipped),
        )
    schedules = read_status(conn, now=NOW)["schedules"]
    mine = [s for s in schedules if s["name"].startswith("ns/")]  # not the built-in ones
    assert [(s["name"], s["missed_slots"], s["skipped_slots"]) for s in mine] == [
        ("ns/hourly", 0, 2),
        ("ns/nightly", 3, 0),
    ]
    json.dumps(schedules)  # plain data, ready for `rota status --json`


def test_prometheus_output_parses_back_with_every_measure(conn, db_url, monkeypatch):
    # The process's counters are shared by all tests, and so is their budget of
    # type labels (the 51st type a process runs is "other"): a counter of its own.
    monkeypatch.setattr(metrics, "RUNS", metrics.RunCounter())
    job_type = f"t{uuid.uuid4().hex[:8]}"
    conn.execute(
        "INSERT INTO rota.job (type, status, run_at)"
        " VALUES (%s, 'ready', now() - interval '100 s')",
        (job_type,),
    )
    for status in ("running", "running", "done", "dead"):
        add_job(conn, job_type, status)
    conn.execute("INSERT INTO rota.lease_expiration VALUES (date_trunc('hour', now(), 'UTC'), 4)")
    conn.execute(
        "INSERT INTO rota.schedule (name, job_type, cron, next_run_at, missed_slots)"
        " VALUES ('ns/nightly', 'report', '0 3 * * *', now(), 6)"
    )
    record_outcome(job_type, "done", 0.3, 1)
    record_outcome(job_type, "retry", 2.0, 1)
    record_outcome(job_type, "dead", 4.0, 3)

    queue = generate_latest(queue_registry(db_url)).decode()
    worker = generate_latest(worker_registry(4, lambda: [job_type])).decode()
    got = samples(queue + worker)

    def value(name: str, **labels: str) -> float:
        return got[(name, frozenset(labels.items()))]

    assert 100 <= value("rota_oldest_ready_job_age_seconds", type=job_type) < 160
    assert value("rota_jobs", status="ready", type=job_type) == 1
    assert value("rota_jobs", status="done", type=job_type) == 1
    assert value("rota_running_jobs", type=job_type) == 2
    assert value("rota_dead_jobs") == 1
    assert value("rota_lease_expirations_total") == 4
    assert value("rota_schedule_missed_slots_total", schedule="ns/nightly", type="report") == 6
    assert value("rota_jobs_dead_total", type=job_type) == 1
    assert value("rota_queue_exporter_leader") == 1
    assert value("rota_worker_slots") == 4
    assert value("rota_worker_running_jobs", type=job_type) == 1
    assert value("rota_jobs_finished_total", type=job_type, outcome="retry") == 1
    assert value("rota_job_duration_seconds_count", type=job_type) == 3
    assert value("rota_job_duration_seconds_bucket", type=job_type, le="2.0") == 2
    assert value("rota_job_duration_seconds_sum", type=job_type) == pytest.approx(6.3)
    assert value("rota_job_attempts_count", type=job_type) == 2  # retry is not final
    assert value("rota_job_attempts_bucket", type=job_type, le="2.0") == 1
    assert value("rota_job_attempts_bucket", type=job_type, le="3.0") == 2
    # Each process serves its own kind of measure, and nothing twice.
    assert "rota_jobs_finished" not in queue and "rota_jobs{" not in worker
    assert "_created" not in queue + worker


def test_a_type_whose_limit_holds_jobs_back_is_limited(conn, db_url):
    due = datetime.now(UTC) - timedelta(minutes=1)  # the exporter reads the database clock
    for status in ("ready", "ready", "running"):
        add_job(conn, "payment", status, run_at=due)
    add_job(conn, "email", "ready", run_at=due)
    conn.execute(
        "INSERT INTO rota.job_limit (type, concurrency) VALUES ('payment', 1), ('email', 5)"
    )
    got = samples(generate_latest(queue_registry(db_url)).decode())
    assert got[("rota_job_type_limited", frozenset({("type", "payment")}))] == 1
    assert got[("rota_job_type_limited", frozenset({("type", "email")}))] == 0


def test_record_outcome_rejects_an_unknown_outcome():
    with pytest.raises(ValueError, match="unknown outcome"):
        record_outcome("email", "exploded", 1.0, 1)


def test_scrapes_within_the_interval_share_one_read(conn, db_url):
    clock = [0.0]
    collector = QueueCollector(db_url, cache_seconds=5, clock=lambda: clock[0])
    add_job(conn, "email", "dead")
    assert [m.samples[0].value for m in collector.collect() if m.name == "rota_dead_jobs"] == [1]
    reads = collector.reads
    add_job(conn, "email", "dead")
    clock[0] = 4.9
    for _ in range(10):
        dead = [m.samples[0].value for m in collector.collect() if m.name == "rota_dead_jobs"]
    assert (dead, collector.reads) == ([1], reads)
    clock[0] = 5.0
    dead = [m.samples[0].value for m in collector.collect() if m.name == "rota_dead_jobs"]
    assert (dead, collector.reads) == ([2], reads + 1)
    collector.close_connection()


def test_database_measures_are_absent_not_stale_when_the_database_is_gone(db_url, pg_server):
    collector = QueueCollector(db_url, cache_seconds=0)
    assert any(m.samples for m in collector.collect())
    pg_server.drop(conninfo_to_dict(db_url)["dbname"])
    families = list(collector.collect())
    assert [m.name for m in families] and not any(m.samples for m in families)


def queue_samples(collector: QueueCollector) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for m in collector.collect()
        for s in m.samples
    }


def exporter_locks(conn: psycopg.Connection[Any]) -> int:
    """Sessions holding the queue exporter's lock in this database."""
    return int(
        conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = 1383036001 AND objid = 0 AND objsubid = 2"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()["n"]
    )


def wait_until_exporter_lock_released(conn: psycopg.Connection[Any]) -> None:
    """A collector's connection is closed: the server ends its session, and lets go of
    the exporter lock, a moment later (longer on a busy machine)."""
    deadline = time.monotonic() + 30
    while exporter_locks(conn):
        assert time.monotonic() < deadline, "the closed collector's session kept its lock"
        time.sleep(0.02)


def test_one_exporter_per_database_serves_the_queue_and_another_takes_over(conn, db_url):
    add_job(conn, "email", "dead")
    first = QueueCollector(db_url, cache_seconds=0)
    second = QueueCollector(db_url, cache_seconds=0)
    try:
        assert queue_samples(first)[("rota_dead_jobs", frozenset())] == 1
        for _ in range(3):  # asking again neither loses nor stacks the lock
            assert queue_samples(first)[("rota_queue_exporter_leader", frozenset())] == 1
            assert queue_samples(second) == {("rota_queue_exporter_leader", frozenset()): 0}
        assert exporter_locks(conn) == 1
        first.close_connection()  # its process died: the lock goes with the connection
        deadline = time.monotonic() + 30  # the server ends the session a moment later
        while (got := queue_samples(second))[("rota_queue_exporter_leader", frozenset())] == 0:
            assert time.monotonic() < deadline, "the second exporter never took over"
            time.sleep(0.02)
        assert got[("rota_dead_jobs", frozenset())] == 1
        assert got[("rota_queue_exporter_leader", frozenset())] == 1
        assert queue_samples(first) == {("rota_queue_exporter_leader", frozenset()): 0}
    finally:
        first.close_connection()
        second.close_connection()


def test_deaths_are_a_counter_that_dead_retry_and_archiving_do_not_lower(conn, db_url):
    add_job(conn, "email", "ready")
    collector = QueueCollector(db_url, cache_seconds=0)
    email = frozenset({("type", "email")})
    assert queue_samples(collector)[("rota_jobs_dead_total", email)] == 0  # from 0, not from 1
    collector.close_connection()
    # Its next scrape opens a new session, which takes the exporter lock only once
    # the closed one has let go of it.
    wait_until_exporter_lock_released(conn)
    add_job(conn, "email", "dead")  # inserted dead
    conn.execute("UPDATE rota.job SET status = 'dead' WHERE status = 'ready'")
    try:
        assert queue_samples(collector)[("rota_jobs_dead_total", email)] == 2
        conn.execute("UPDATE rota.job SET status = 'ready' WHERE status = 'dead'")  # dead retry
        conn.execute("UPDATE rota.job SET status = 'ready' WHERE status = 'ready'")  # not again
        got = queue_samples(collector)
        assert (got[("rota_jobs_dead_total", email)], got[("rota_dead_jobs", frozenset())]) == (
            2,
            0,
        )
        conn.execute("UPDATE rota.job SET status = 'dead'")  # both die once more
        conn.execute("DELETE FROM rota.job")  # archived
        got = queue_samples(collector)
        assert (got[("rota_jobs_dead_total", email)], got[("rota_dead_jobs", frozenset())]) == (
            4,
            0,
        )
    finally:
        collector.close_connection()


def test_queue_types_beyond_the_bound_fold_into_other(conn, db_url):
    for job_type, status in [("a", "ready"), ("b", "dead"), ("c", "ready"), ("d", "dead")]:
        add_job(conn, job_type, status, NOW - timedelta(seconds=ord(job_type)))
    collector = QueueCollector(db_url, cache_seconds=0, settings=MetricsSettings(max_types=2))
    try:
        got = queue_samples(collector)
    finally:
        collector.close_connection()
    types = {dict(labels).get("type") for _, labels in got} - {None}
    assert types == {"a", "b", "other"}
    other = frozenset({("type", "other")})
    assert got[("rota_jobs", other | {("status", "ready")})] == 1
    assert got[("rota_jobs", other | {("status", "dead")})] == 1
    assert got[("rota_jobs_dead_total", other)] == 1


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _plan_nodes(child))]


def _metrics_queries() -> list[str]:
    text = resources.files("rota.sql").joinpath("metrics.sql").read_text(encoding="utf-8")
    return sorted(sql.parse(text))


def test_no_metrics_query_scans_the_job_table(conn):
    # Loaded with the per-row done trigger off: one statement bumping the same
    # counter row 200,000 times in one transaction is slow, and it is not what
    # is measured here. The counts are then filled in as 0003_metrics does.
    conn.execute("ALTER TABLE rota.job DISABLE TRIGGER job_done_count_insert")
    conn.execute(
        "INSERT INTO rota.job (type, status, run_at, finished_at, attempts)"
        " SELECT 'type' || (i % 7), 'done', now() - interval '1 day', now(), 1"
        " FROM generate_series(1, 200000) AS i"
    )
    conn.execute("ALTER TABLE rota.job ENABLE TRIGGER job_done_count_insert")
    conn.execute(
        "INSERT INTO rota.job_done_count (type, shard, count)"
        " SELECT type, 0, count(*) FROM rota.job WHERE status = 'done' GROUP BY type"
    )
    for status in ("ready", "ready", "running", "failed", "dead"):
        add_job(conn, "email", status)
    conn.execute("VACUUM ANALYZE rota.job")
    assert read_status(conn)["types"]["type0"]["done"] == 28571

    def seq_scans_job(statement: bytes) -> bool:
        params = {"now": NOW, "types": None}
        row = conn.execute(b"EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
        nodes = _plan_nodes(next(iter(row.values()))[0]["Plan"])
        return any("Seq Scan" in n["Node Type"] and n.get("Relation Name") == "job" for n in nodes)

    # The check can fail: counting the done rows themselves would read them all.
    assert seq_scans_job(b"SELECT count(*) FROM rota.job WHERE status = 'done'")
    for name in _metrics_queries():
        assert not seq_scans_job(sql.query(name).encode()), name
    conn.execute("INSERT INTO rota.job_limit (type, concurrency) VALUES ('email', 1)")
    assert not seq_scans_job(sql.query("limit_states").encode())


def test_exporter_refuses_bad_input_in_one_line(capsys):
    from rota.cli import main

    assert main(["exporter", "--port", "70000"]) == 2
    assert main(["exporter", "--cache", "-1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["rota: error: --port must be 0-65535, not 70000",
                   "rota: error: --cache must be 0 or more seconds, not -1.0"]  # fmt: skip


def test_reading_the_status_never_takes_the_exporter_lock(db_url):
    reader, exporter = QueueCollector(db_url), QueueCollector(db_url)
    try:
        assert reader.status() is not None
        assert queue_samples(exporter)[("rota_queue_exporter_leader", frozenset())] == 1
    finally:
        reader.close_connection()
        exporter.close_connection()
