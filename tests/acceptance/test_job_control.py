"""Job control in real `rota worker` processes: timeouts (async, thread and process
isolation), cancellation, pause and resume, priorities, and bad input."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rota
from tests.acceptance.procs import WorkerProcess, free_port, probe, wait_for
from tests.acceptance.procs import rota as run_rota


def scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else next(iter(row.values()))


def count(conn: psycopg.Connection[Any], where: str, *params: Any) -> int:
    return int(scalar(conn, f"SELECT count(*) FROM rota.job WHERE {where}", *params))


@pytest.fixture
def tables(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "CREATE TABLE runs (seq bigserial, job_id bigint, attempt int, pid int, note text,"
        " at timestamptz DEFAULT clock_timestamp())"
    )
    conn.execute("CREATE TABLE gate (job_id bigint PRIMARY KEY)")


def healthz(port: int) -> int | None:
    return probe(port, "/healthz")


def test_hung_async_handlers_time_out_and_the_quick_jobs_flow(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    hung = rota.enqueue_many(
        db_url, [rota.NewJob("hang.async", {"n": i}, max_attempts=2) for i in range(5)]
    )
    rota.enqueue_many(db_url, [rota.NewJob("noop", {"n": i}) for i in range(200)])
    worker = WorkerProcess(
        db_url, "--concurrency", "4", "--job-timeout", "1", log=tmp_path / "w.log"
    )
    try:
        wait_for(lambda: count(conn, "type = 'noop' AND status = 'done'") == 200, what="noops")
        wait_for(
            lambda: count(conn, "type = 'hang.async' AND status = 'dead'") == 5,
            what="the hung jobs to end dead",
        )
    finally:
        assert worker.stop() == 0
    rows = conn.execute(
        "SELECT attempts, last_error FROM rota.job WHERE id = ANY(%s)", (hung,)
    ).fetchall()
    assert all(r["attempts"] == 2 and r["last_error"].startswith("Timeout:") for r in rows), rows
    assert count(conn, "status = 'running'") == 0
    # Each attempt saw asyncio.CancelledError.
    assert scalar(conn, "SELECT count(*) FROM runs WHERE note = 'cancelled'") == 10


def test_process_isolation_kills_children_that_outlive_their_timeout(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    hung = rota.enqueue_many(
        db_url, [rota.NewJob("hang.sync", {"n": i}, max_attempts=2, timeout=1) for i in range(3)]
    )
    rota.enqueue_many(db_url, [rota.NewJob("noop") for _ in range(20)])
    worker = WorkerProcess(
        db_url, "--isolation", "process", "--concurrency", "2", log=tmp_path / "w.log"
    )
    try:
        wait_for(
            lambda: count(conn, "type = 'hang.sync' AND status = 'dead'") == 3,
            timeout=120,
            what="the hung jobs to be retried and end dead",
        )
        assert count(conn, "type = 'noop' AND status = 'done'") == 20
        pids = [r["pid"] for r in conn.execute("SELECT DISTINCT pid FROM runs").fetchall()]
        assert len(pids) >= 2 and os.getpid() not in pids  # children, not the test

        def all_gone() -> bool:
            for pid in pids:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    continue
                return False
            return True

        wait_for(all_gone, timeout=60, what="the children to be killed")
    finally:
        assert worker.stop() == 0
    attempts = [r["attempts"] for r in conn.execute(
        "SELECT attempts FROM rota.job WHERE id = ANY(%s)", (hung,)
    ).fetchall()]  # fmt: skip
    assert attempts == [2, 2, 2]
    assert "killing it" in worker.output()


def test_a_child_past_its_timeout_is_killed_before_its_slot_is_reused(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    # One slot: the child that ignores its timeout gets SIGTERM after the kill
    # grace; the next job starts only after it noted that signal.
    hung = rota.enqueue(db_url, "hang.sync.noted", max_attempts=1, timeout=1)
    rota.enqueue(db_url, "noted", delay=0.5)
    worker = WorkerProcess(
        db_url, "--isolation", "process", "--concurrency", "1", log=tmp_path / "w.log"
    )
    try:
        wait_for(lambda: count(conn, "status = 'done'") == 1, 120, "the next job to run")
    finally:
        assert worker.stop() == 0
    notes = conn.execute("SELECT job_id, note FROM runs ORDER BY at, seq").fetchall()
    assert [(r["job_id"] == hung, r["note"]) for r in notes] == [
        (True, "started"),
        (True, "terminated"),
        (False, "started"),
    ]
    assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", hung) == "dead"


def test_a_thread_past_its_timeout_keeps_its_slot_and_healthz_fails_at_the_limit(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    # A thread cannot be killed: one that ignores its timeout runs on, reported,
    # and keeps its slot (its lease renewed, its job running) until it returns, so
    # that no second handler starts in its place. Once every slot is taken so,
    # /healthz fails; when the threads return, their jobs end and work goes on.
    port = free_port()
    first = rota.enqueue(db_url, "stubborn", max_attempts=1)  # handler default timeout: 1 s
    worker = WorkerProcess(
        db_url, "--concurrency", "2", "--metrics-port", str(port), log=tmp_path / "w.log"
    )
    overrun = "the handler's thread runs on past its stop"
    try:
        wait_for(lambda: worker.output().count(overrun) == 1, what="the first to overrun")
        rota.enqueue_many(db_url, [rota.NewJob("noop") for _ in range(50)])
        wait_for(lambda: count(conn, "type = 'noop' AND status = 'done'") == 50, what="noops")
        assert healthz(port) == 200
        assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", first) == "running"
        second = rota.enqueue(db_url, "stubborn", max_attempts=1)
        wait_for(lambda: worker.output().count(overrun) == 2, what="the second to overrun")
        wait_for(lambda: healthz(port) == 503, what="/healthz to fail at the concurrency")
        waiting = rota.enqueue(db_url, "noop")
        # Both still hold their slots (the noop may be claimed ahead, running in
        # the table while it waits for a slot, but it cannot start).
        assert count(conn, "type = 'stubborn' AND status = 'running'") == 2
        assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", waiting) != "done"
        conn.execute("INSERT INTO gate VALUES (%s), (%s)", (first, second))
        wait_for(lambda: count(conn, "type = 'stubborn' AND status = 'dead'") == 2, what="ends")
        wait_for(lambda: healthz(port) == 200, what="/healthz once the threads returned")
        wait_for(
            lambda: scalar(conn, "SELECT status FROM rota.job WHERE id = %s", waiting) == "done",
            what="the job that waited for a slot",
        )
        last_errors = conn.execute(
            "SELECT last_error FROM rota.job WHERE type = 'stubborn'"
        ).fetchall()
        assert all(r["last_error"].startswith("Timeout:") for r in last_errors)
        started = conn.execute("SELECT job_id FROM runs ORDER BY seq").fetchall()
        assert [r["job_id"] for r in started] == [first, second]  # each ran once
    finally:
        conn.execute("INSERT INTO gate SELECT id FROM rota.job ON CONFLICT DO NOTHING")
        assert worker.stop() == 0


def test_a_cancelled_ready_job_never_starts(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    job_id = rota.enqueue(db_url, "noted")
    done = run_rota(db_url, "jobs", "cancel", str(job_id))
    assert done.returncode == 0, done.stderr
    assert "1 job(s) cancelled" in done.stdout
    assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "cancelled"
    later = rota.enqueue(db_url, "noted")
    worker = WorkerProcess(db_url, log=tmp_path / "w.log")
    try:
        wait_for(
            lambda: scalar(conn, "SELECT status FROM rota.job WHERE id = %s", later) == "done",
            what="a later job to run",
        )
    finally:
        assert worker.stop() == 0
    assert scalar(conn, "SELECT count(*) FROM runs WHERE job_id = %s", job_id) == 0
    shown = run_rota(db_url, "jobs", "list", "--status", "cancelled")
    assert str(job_id) in shown.stdout and "cancelled" in shown.stdout


def test_a_cancelled_running_async_job_stops_within_a_heartbeat(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    lease = 9.0
    job_id = rota.enqueue(db_url, "hang.async")
    worker = WorkerProcess(db_url, "--lease", str(lease), log=tmp_path / "w.log")
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM runs") == 1, what="the job to start")
        asked = run_rota(db_url, "jobs", "cancel", str(job_id))
        assert asked.returncode == 0, asked.stderr
        assert "asked to stop" in asked.stdout
        wait_for(
            lambda: (
                scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "cancelled"
            ),
            what="the job to end cancelled",
        )
    finally:
        assert worker.stop() == 0
    seen = scalar(
        conn,
        "SELECT extract(epoch FROM r.at - j.cancel_requested_at) FROM runs r"
        " JOIN rota.job j ON j.id = r.job_id WHERE r.note = 'cancelled'",
    )
    assert seen is not None and 0 <= seen <= lease / 3 + 1
    assert scalar(conn, "SELECT attempts FROM rota.job WHERE id = %s", job_id) == 1


def test_a_paused_type_waits_while_the_others_drain(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    rota.enqueue_many(db_url, [rota.NewJob("noop") for _ in range(500)])
    rota.enqueue_many(db_url, [rota.NewJob("noop.other") for _ in range(500)])
    assert run_rota(db_url, "pause", "noop").returncode == 0
    status = run_rota(db_url, "status")
    assert "PAUSED" in status.stdout
    worker = WorkerProcess(db_url, "--concurrency", "8", log=tmp_path / "w.log")
    try:
        wait_for(
            lambda: count(conn, "type = 'noop.other' AND status = 'done'") == 500,
            what="the other type to drain",
        )
        assert count(conn, "type = 'noop' AND attempts = 0 AND status = 'ready'") == 500
        assert run_rota(db_url, "resume", "noop").returncode == 0
        wait_for(lambda: count(conn, "type = 'noop' AND status = 'done'") == 500, what="resumed")
    finally:
        assert worker.stop() == 0


def test_urgent_jobs_pass_a_backlog(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    """Once urgent jobs can be seen, the worker claims them ahead of its backlog.

    The interleaving is held still: the backlog's type is paused while the urgent
    jobs are enqueued, so a claim either sees the pause (and takes none of them) or
    comes after the resume, which follows their commit. Unpaused, a claim whose
    snapshot predates their commit may take backlog jobs after their created_at, as
    many as the worker claims in that window: a number that grows with the load."""
    rota.enqueue_many(db_url, [rota.NewJob("noted", {"low": i}, priority=9) for i in range(100)])
    worker = WorkerProcess(db_url, "--concurrency", "1", log=tmp_path / "w.log")
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM runs") >= 3, what="the backlog")
        rota.pause(conn, ["noted"])
        # The jobs claimed before the pause end (or are given back); a claim still in
        # flight then may yet take some, all started before the urgent ones exist.
        wait_for(lambda: count(conn, "status = 'running'") == 0, what="the worker to go quiet")
        urgent = rota.enqueue_many(db_url, [rota.NewJob("noted", priority=0) for _ in range(10)])
        rota.resume(conn, ["noted"])
        wait_for(
            lambda: count(conn, "id = ANY(%s) AND status = 'done'", urgent) == 10,
            what="the urgent jobs",
        )
    finally:
        assert worker.stop() == 0
    last_urgent = scalar(conn, "SELECT max(started_at) FROM rota.job WHERE id = ANY(%s)", urgent)
    enqueued = scalar(conn, "SELECT min(created_at) FROM rota.job WHERE id = ANY(%s)", urgent)
    # Every low job claimed after the urgent ones were enqueued was claimed by a
    # statement that saw them, and each claim takes the most urgent jobs first. One
    # low job may still start before the last urgent one: while the worker's first
    # claim lane holds the last urgent jobs locked, its second (claiming ahead of
    # fast jobs, one job at this concurrency) skips them and may take a low one,
    # with a start time (its transaction's) earlier than theirs.
    overtaken = count(
        conn,
        "priority = 9 AND started_at > %s AND started_at < %s",
        enqueued,
        last_urgent,
    )
    assert overtaken <= 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pause"], "give job types or --all"),
        (["resume"], "give job types or --all"),
        (["pause", "t", "--all"], "give job types or --all"),
        (["enqueue", "t", "--timeout", "-1"], "argument --timeout: must be more than 0"),
        (["enqueue", "t", "--priority", "10"], "argument --priority: must be a whole number"),
        (["enqueue", "t", "--priority", "-1"], "argument --priority: must be a whole number"),
        (["jobs", "cancel", "999999"], "no job with id 999999"),
        (["jobs", "cancel"], "give job ids or --type"),
        (["jobs", "cancel", "--status", "ready"], "give job ids or --type"),
        (["schedule", "add", "s", "--type", "t", "--cron", "@daily", "--priority", "12"],
         "argument --priority: must be"),
        (["schedule", "add", "s", "--type", "t", "--cron", "@daily", "--timeout", "0"],
         "argument --timeout: must be more than 0"),
        (["worker", "--job-timeout", "-3"], "--job-timeout must be more than 0"),
        (["worker", "--isolation", "fork"], "invalid choice"),
        (["worker", "--max-jobs-per-child", "2"], "--max-jobs-per-child is for child processes"),
        (["worker", "--max-child-memory", "0", "--isolation", "process"],
         "argument --max-child-memory: must be at least 1"),
    ],
)  # fmt: skip
def test_bad_job_control_input_is_refused_and_writes_nothing(
    db_url: str, conn: psycopg.Connection[Any], argv: list[str], message: str
) -> None:
    known = rota.enqueue(db_url, "t")

    def state() -> tuple[Any, ...]:
        return (
            conn.execute("SELECT * FROM rota.job ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM rota.paused_type").fetchall(),
            conn.execute("SELECT name FROM rota.schedule ORDER BY name").fetchall(),
        )

    before = state()
    done = run_rota(db_url, *argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert state() == before
    assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", known) == "ready"


def test_handlers_keep_asyncio_timeout_and_task_groups_and_a_burst_of_no_ops_drains(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    """Whatever the worker's task factory (eager on Python 3.12+ by default): a
    handler's asyncio.timeout() and TaskGroup work, the worker's job timeout
    still stops a hung handler, and no-op jobs that end as they start drain at a
    high concurrency (each ended attempt starts the next without nesting)."""
    tools = rota.enqueue_many(db_url, [rota.NewJob("asyncio.tools") for _ in range(3)])
    hung = rota.enqueue(db_url, "hang.async", max_attempts=1, timeout=0.5)
    rota.enqueue_many(db_url, [rota.NewJob("noop", {"n": i}) for i in range(3000)])
    worker = WorkerProcess(db_url, "--concurrency", "500", log=tmp_path / "w.log")
    try:
        wait_for(lambda: count(conn, "status = 'done'") == 3003, what="the jobs", timeout=120)
        wait_for(lambda: count(conn, "id = %s AND status = 'dead'", hung), what="the timeout")
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    notes = conn.execute(
        "SELECT note, count(*) AS n FROM runs WHERE job_id = ANY(%s) GROUP BY note ORDER BY note",
        (tools,),
    ).fetchall()
    assert [(r["note"], r["n"]) for r in notes] == [("own timeout", 3), ("task group 3", 3)]
    assert scalar(conn, "SELECT last_error FROM rota.job WHERE id = %s", hung).startswith(
        "Timeout:"
    )
    assert "Traceback" not in worker.output()
