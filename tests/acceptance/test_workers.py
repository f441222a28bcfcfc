"""Real `rota worker` processes: draining, crashes, dead letters, stolen leases, skewed clocks."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rota
from tests.acceptance.procs import WorkerProcess, wait_for
from tests.acceptance.procs import rota as run_rota


def scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else next(iter(row.values()))


@pytest.fixture
def tables(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE effects (key text NOT NULL, job_id bigint, attempt int)")
    conn.execute("CREATE TABLE started (job_id bigint, attempt int)")
    conn.execute("CREATE TABLE gate (job_id bigint PRIMARY KEY)")


def test_four_workers_drain_2000_jobs_with_each_effect_once(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    rota.enqueue_many(
        db_url, [rota.NewJob("effect", {"n": i}, key=f"order-{i}") for i in range(2000)]
    )
    workers = [
        WorkerProcess(db_url, "--concurrency", "8", log=tmp_path / f"w{i}.log") for i in range(4)
    ]
    try:
        wait_for(
            lambda: scalar(conn, "SELECT count(*) FROM rota.job WHERE status = 'done'") == 2000,
            timeout=120,
            what="all 2000 jobs done",
        )
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0, 0, 0]
    assert scalar(conn, "SELECT count(*) FROM effects") == 2000
    assert scalar(conn, "SELECT count(DISTINCT key) FROM effects") == 2000
    assert scalar(conn, "SELECT count(*) FROM rota.job WHERE status IN ('ready', 'running')") == 0
    # The workers shared the queue (SKIP LOCKED) instead of one serialising the rest.
    lockers = scalar(conn, "SELECT count(DISTINCT locked_by) FROM rota.job")
    assert lockers >= 2


def test_sigkill_mid_job_the_reaper_returns_it_and_another_worker_finishes(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    job_id = rota.enqueue(db_url, "hang.first")
    doomed = WorkerProcess(db_url, "--lease", "2", "--no-reaper", log=tmp_path / "doomed.log")
    wait_for(
        lambda: scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "running",
        what="the job to start",
    )
    doomed.signal(signal.SIGKILL)
    doomed.wait()
    wait_for(
        lambda: scalar(conn, "SELECT locked_until < now() FROM rota.job WHERE id = %s", job_id),
        what="the lease to expire by the database clock",
    )
    reaped = run_rota(db_url, "reaper", "--once")
    assert reaped.returncode == 0, reaped.stderr
    assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "ready"
    rescuer = WorkerProcess(db_url, "--no-reaper", log=tmp_path / "rescuer.log")
    try:
        wait_for(
            lambda: scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "done",
            what="the job to be finished by the second worker",
        )
    finally:
        assert rescuer.stop() == 0
    row = conn.execute(
        "SELECT attempts, last_error FROM rota.job WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None and row["attempts"] == 2
    assert row["last_error"].startswith("LeaseExpired")
    assert scalar(conn, "SELECT sum(count) FROM rota.lease_expiration") == 1


def test_a_handler_that_always_raises_ends_dead_and_dead_retry_revives_it(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    job_id = rota.enqueue(db_url, "always.fails", {"id": 7}, max_attempts=3)
    worker = WorkerProcess(db_url, log=tmp_path / "w.log")
    try:
        wait_for(
            lambda: scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "dead",
            timeout=60,
            what="the job to be dead",
        )
    finally:
        assert worker.stop() == 0
    row = conn.execute(
        "SELECT attempts, last_error FROM rota.job WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None and row["attempts"] == 3
    assert row["last_error"].startswith("ValueError: cannot process {'id': 7}")
    assert "Traceback" not in row["last_error"] and "always_fails" in row["last_error"]
    revived = run_rota(db_url, "dead", "retry", str(job_id))
    assert revived.returncode == 0
    assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "ready"


def test_a_worker_whose_lease_was_stolen_cannot_complete_the_job(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    job_id = rota.enqueue(db_url, "gated")
    first = WorkerProcess(db_url, "--no-reaper", log=tmp_path / "first.log")
    second: WorkerProcess | None = None
    try:
        wait_for(
            lambda: scalar(conn, "SELECT count(*) FROM started") == 1, what="attempt 1 to start"
        )
        first_id = scalar(conn, "SELECT locked_by FROM rota.job WHERE id = %s", job_id)
        # Freeze the first worker (so it cannot claim the job again itself), take
        # its lease away (expire it, reap it) and let a second worker claim it.
        first.signal(signal.SIGSTOP)
        conn.execute(
            "UPDATE rota.job SET locked_until = now() - interval '1 second' WHERE id = %s",
            (job_id,),
        )
        assert run_rota(db_url, "reaper", "--once").returncode == 0
        second = WorkerProcess(db_url, "--no-reaper", log=tmp_path / "second.log")
        wait_for(
            lambda: scalar(conn, "SELECT count(*) FROM started") == 2, what="attempt 2 to start"
        )
        second_id = scalar(conn, "SELECT locked_by FROM rota.job WHERE id = %s", job_id)
        assert second_id != first_id
        # Let only the first (stale) handler finish: the second one is still gated
        # on the same row, so stop the second worker, wake the first, open the gate.
        second.signal(signal.SIGKILL)
        second.wait()
        first.signal(signal.SIGCONT)
        conn.execute("INSERT INTO gate VALUES (%s)", (job_id,))
        wait_for(lambda: "lease lost" in first.output(), what="the first worker to notice")
        row = conn.execute(
            "SELECT status, locked_by, attempts FROM rota.job WHERE id = %s", (job_id,)
        ).fetchone()
        assert row == {"status": "running", "locked_by": second_id, "attempts": 2}
    finally:
        first.signal(signal.SIGCONT)
        first.stop()
        if second is not None and second.proc.poll() is None:
            second.proc.kill()
            second.wait()


def test_a_worker_with_a_skewed_host_clock_behaves_by_the_database_clock(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    skew = (
        "import time, datetime as _dt\n"
        "_real = time.time\n"
        "time.time = lambda: _real() + 3600\n"
        "class _Skewed(_dt.datetime):\n"
        "    @classmethod\n"
        "    def now(cls, tz=None):\n"
        "        return _dt.datetime.fromtimestamp(time.time(), tz)\n"
        "_dt.datetime = _Skewed\n"
    )
    gated = rota.enqueue(db_url, "gated")
    rota.enqueue_many(db_url, [rota.NewJob("noop") for _ in range(50)])
    worker = WorkerProcess(db_url, "--lease", "6", prelude=skew, log=tmp_path / "skewed.log")
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM started") == 1, what="the gated job")
        # The lease is measured from the database clock, not the host's (an hour ahead).
        lease_left = scalar(
            conn,
            "SELECT extract(epoch FROM locked_until - now()) FROM rota.job WHERE id = %s",
            gated,
        )
        assert 0 < lease_left <= 6
        # Heartbeats keep it alive well past one lease.
        first_until = scalar(conn, "SELECT locked_until FROM rota.job WHERE id = %s", gated)
        wait_for(
            lambda: (
                scalar(conn, "SELECT locked_until FROM rota.job WHERE id = %s", gated) > first_until
            ),
            what="a heartbeat",
        )
        conn.execute("INSERT INTO gate VALUES (%s)", (gated,))
        wait_for(
            lambda: scalar(conn, "SELECT count(*) FROM rota.job WHERE status = 'done'") == 51,
            what="all jobs done",
        )
    finally:
        assert worker.stop() == 0
    assert scalar(conn, "SELECT max(attempts) FROM rota.job") == 1
    assert scalar(conn, "SELECT count(*) FROM rota.job WHERE finished_at > now()") == 0


def test_sigterm_lets_running_jobs_finish_and_gives_back_the_rest(
    db_url: str, conn: psycopg.Connection[Any], tables: None, tmp_path: Path
) -> None:
    quick = rota.enqueue(db_url, "slow", {"seconds": 1})
    stuck = rota.enqueue(db_url, "gated")
    worker = WorkerProcess(db_url, "--grace-period", "2", log=tmp_path / "w.log")
    wait_for(
        lambda: scalar(conn, "SELECT count(*) FROM rota.job WHERE status = 'running'") == 2,
        what="both jobs to run",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    rows = {r["id"]: r for r in conn.execute("SELECT id, status, attempts FROM rota.job")}
    assert rows[quick]["status"] == "done"
    assert (rows[stuck]["status"], rows[stuck]["attempts"]) == ("ready", 0)


def test_a_worker_stopped_as_soon_as_it_was_started_exits_0(db_url: str, tmp_path: Path) -> None:
    # The helper's SIGTERM waits until the worker can take it: sent while the
    # worker still imports its handlers, it would end the process (-15), as it
    # did to an idle second worker whose jobs another one had finished.
    worker = WorkerProcess(db_url, log=tmp_path / "w.log")
    assert worker.stop() == 0, worker.output()


def test_the_scheduler_inside_a_worker_enqueues_a_due_slot_that_the_worker_runs(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    from rota import schedule_store as schedules

    row = schedules.upsert(db_url, schedules.ScheduleSpec("every-minute", "noop", "* * * * *"))
    conn.execute(
        "UPDATE rota.schedule SET next_run_at = date_trunc('minute', now()) - interval '1 minute'"
        " WHERE id = %s",
        (row["id"],),
    )
    worker = WorkerProcess(db_url, log=tmp_path / "w.log")
    try:
        wait_for(
            lambda: (
                scalar(conn, "SELECT status FROM rota.job WHERE schedule_id = %s", row["id"])
                == "done"
            ),
            what="the scheduled job to run",
        )
    finally:
        assert worker.stop() == 0
    key = scalar(conn, "SELECT idempotency_key FROM rota.job WHERE schedule_id = %s", row["id"])
    assert key.startswith(f"schedule:{row['id']}:")


def test_a_worker_refuses_to_start_for_a_type_no_handler_serves(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rota.cli import main

    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    # rota.archive is served (a built-in); "emial" is a typo no loaded handler serves.
    assert main(["worker", "--types", "rota.archive,emial", "--no-scheduler"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'emial'" in err and "rota.archive" in err, err
