"""Steps under faults: a worker process killed (SIGKILL) inside a step and
between every pair of steps, over bounded random runs. Every step's effect
happens once and every job finishes.

A kill of the worker leaves its job running under a dead lease: the reaper
gives it back once the lease (1 s here) has expired, with no backoff, and the
next worker goes on from the last stored step. In process isolation only the
handler's child process dies; the worker retries the job itself."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import rota
from rota.reaper import Reaper, ReaperSettings
from rota.settings import BackoffSettings
from tests.acceptance.procs import env_for, wait_for
from tests.durable.helpers import row

STEPS = 4
POINTS = [f"{where}-{i}" for i in range(STEPS) for where in ("inside", "after")]
NO_BACKOFF = ReaperSettings(backoff=BackoffSettings(base_seconds=0, cap_seconds=0, jitter=0))


@pytest.fixture
def tables(conn: Any) -> Iterator[None]:
    conn.execute("CREATE TABLE fault_effect (job_id bigint, step int)")
    conn.execute("CREATE TABLE fault_kill (job_id bigint, point text, PRIMARY KEY (job_id, point))")
    yield


def _worker(db_url: str, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "rota", "worker", "--handlers", "tests.durable.fault_handlers"]
    argv += ["--concurrency", "1", "--lease", "1", "--no-scheduler", "--no-reaper", *extra]
    env = env_for(db_url, ROTA_LOG_LEVEL="WARNING")
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run_to_the_end(conn: Any, db_url: str, job_id: int, kills: int) -> int:
    """Start workers until the job is done, reaping after each killed one; the workers started."""
    started = 0
    while row(conn, job_id)["status"] != "done":
        assert started <= kills, f"job {job_id} did not finish after {kills} kills"
        worker = _worker(db_url)
        started += 1
        try:
            wait_for(
                lambda w=worker: w.poll() is not None or row(conn, job_id)["status"] == "done",
                what=f"job {job_id} to finish or its worker to die",
            )
        finally:
            if worker.poll() is None:
                worker.terminate()
            worker.wait(60)
        if row(conn, job_id)["status"] == "running":
            wait_for(
                lambda: Reaper(NO_BACKOFF).run_once(db_url).requeued,
                what=f"job {job_id}'s lease to expire",
            )
    return started


def _check(conn: Any, job_id: int, kills: list[str]) -> None:
    done = row(conn, job_id)
    assert (done["status"], done["result"]) == ("done", "finished")
    effects = conn.execute(
        "SELECT step, count(*) AS n FROM fault_effect WHERE job_id = %s"
        " GROUP BY step ORDER BY step",
        (job_id,),
    ).fetchall()
    assert [(e["step"], e["n"]) for e in effects] == [(i, 1) for i in range(STEPS)], kills
    fired = conn.execute("SELECT point FROM fault_kill WHERE job_id = %s", (job_id,)).fetchall()
    assert sorted(f["point"] for f in fired) == sorted(kills)


def test_a_kill_at_every_point_costs_no_step_twice(conn, db_url, tables) -> None:
    job_id = rota.enqueue(conn, "fault.steps", {"steps": STEPS, "kills": POINTS}, max_attempts=50)
    assert _run_to_the_end(conn, db_url, job_id, len(POINTS)) == len(POINTS) + 1
    _check(conn, job_id, POINTS)


def test_a_worker_killed_after_each_step_costs_the_job_no_attempt(conn, db_url, tables) -> None:
    kills = [f"after-{i}" for i in range(STEPS - 1)]
    job_id = rota.enqueue(conn, "fault.steps", {"steps": STEPS, "kills": kills}, max_attempts=1)
    _run_to_the_end(conn, db_url, job_id, len(kills))
    _check(conn, job_id, kills)
    assert row(conn, job_id)["attempts"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_random_kills_cost_no_step_twice(conn, db_url, tables, seed: int) -> None:
    kills = random.Random(seed).sample(POINTS, random.Random(seed).randint(1, 3))
    job_id = rota.enqueue(conn, "fault.steps", {"steps": STEPS, "kills": kills}, max_attempts=50)
    _run_to_the_end(conn, db_url, job_id, len(kills))
    _check(conn, job_id, kills)


def test_a_killed_handler_process_costs_no_step_twice(conn, db_url, tables) -> None:
    kills = ["inside-1", "after-2"]
    job_id = rota.enqueue(conn, "fault.steps", {"steps": STEPS, "kills": kills}, max_attempts=50)
    worker = _worker(db_url, "--isolation", "process")
    try:
        wait_for(lambda: row(conn, job_id)["status"] == "done", what=f"job {job_id} to finish")
    finally:
        worker.terminate()
        worker.wait(60)
    _check(conn, job_id, kills)
