"""Durable jobs whose sync handlers run in the worker's threads or in its child
processes (`--isolation process`): steps, sleeps, waits and children behave
alike, a child retired between a job's suspension and its resumption changes
nothing, a child killed inside a step leaves nothing of it, and the worker's
stop leaves each job where it stood.

The handlers are tests/durable/isolation_handlers.py, which a child imports
by name; each writes what it did, with its process, to the table `effect`."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

import pytest

import rota
from rota.durable import wake_due
from rota.reaper import ReaperSettings
from rota.settings import BackoffSettings
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.durable.helpers import (
    ISOLATION_HANDLERS,
    did,
    effects,
    isolated,
    later,
    row,
    running,
    until_status,
)

FAST = BackoffSettings(base_seconds=0.01, cap_seconds=0.01)

ISOLATIONS = {
    "thread": {"isolation": "thread"},
    "process": {"isolation": "process"},
    "process, a child per attempt": {"isolation": "process", "max_jobs_per_child": 1},
}


def _worker(conn: Any, db_url: str, concurrency: int = 1, **settings: Any) -> Any:
    return running(
        db_url, isolated(conn), concurrency, handler_modules=[ISOLATION_HANDLERS], **settings
    )


def _pids(conn: Any, job_id: int, *whats: str) -> list[int]:
    return [pid for what, pid in effects(conn, job_id) if what in whats]


@pytest.mark.parametrize("settings", ISOLATIONS.values(), ids=ISOLATIONS.keys())
def test_steps_a_sleep_and_a_wait_resume_in_every_isolation(conn, db_url, settings) -> None:
    job_id = rota.enqueue(conn, "iso.journey", {"key": "shipped"})
    with _worker(conn, db_url, **settings):
        until_status(conn, job_id, "waiting")  # asleep
        assert wake_due(db_url, now=later(conn, 3601)) == [job_id]
        wait = "SELECT 1 FROM rota.job_wait WHERE job_id = %s AND name = 'event:shipped'"
        wait_for(lambda: conn.execute(wait, (job_id,)).fetchone(), what="the event's wait")
        until_status(conn, job_id, "waiting")
        assert rota.emit(conn, "shipped", {"parcel": 7}) == 1
        done = until_status(conn, job_id, "done", "failed", "dead")
    assert done["result"] == ["first", {"parcel": 7}, "last"]
    assert done["attempts"] == 1  # the two suspensions counted none
    assert [what for what, _ in effects(conn, job_id)] == ["first", "last"]
    first, last = _pids(conn, job_id, "first", "last")
    if settings["isolation"] == "thread":
        assert first == last == os.getpid()
    elif settings.get("max_jobs_per_child") == 1:  # retired between the two runs
        assert len({first, last, os.getpid()}) == 3
    else:
        assert first == last != os.getpid()


def test_a_short_sleep_in_a_child_brings_the_reapers_next_pass_forward(conn, db_url) -> None:
    # The child's suspension reaches the worker as an outcome, as a thread's does.
    settings = WorkerSettings(
        concurrency=1,
        run_scheduler=False,
        poll_interval_seconds=0.2,
        reaper=ReaperSettings(interval_seconds=30),
        isolation="process",
        handler_modules=[ISOLATION_HANDLERS],
    )
    worker = Worker(db_url, settings, handlers=isolated(conn))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        job_id = rota.enqueue(conn, "iso.naps.briefly")
        assert until_status(conn, job_id, "done")["result"] == "rested"
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    late = conn.execute(
        "SELECT ended_at - until AS late FROM rota.job_wait WHERE job_id = %s", (job_id,)
    ).fetchone()["late"]
    assert late < timedelta(seconds=1.5), late


@pytest.mark.parametrize("settings", ISOLATIONS.values(), ids=ISOLATIONS.keys())
def test_children_fan_in_to_a_parent_in_another_process(conn, db_url, settings) -> None:
    parent = rota.enqueue(conn, "iso.fans.out", {"children": 3})
    with _worker(conn, db_url, concurrency=2, **settings):
        done = until_status(conn, parent, "done", "failed", "dead")
    results = done["result"]["results"]
    assert [r["double"] for r in results] == [0, 2, 4]
    assert _pids(conn, parent, "sum") == [done["result"]["pid"]]
    children = conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (parent,))
    done_by_children = [what for c in children.fetchall() for what, _ in effects(conn, c["id"])]
    assert done_by_children == ["double"] * 3
    if settings.get("max_jobs_per_child") == 1:  # each run in a process of its own
        assert len({r["pid"] for r in results} | {done["result"]["pid"]}) == 4


@pytest.mark.parametrize("stop", ["timeout", "cancel"])
def test_a_child_killed_inside_a_step_leaves_nothing_of_it(conn, db_url, stop) -> None:
    # The step wrote through its connection, then ignores its stop: its child is
    # killed after the kill grace, and the write goes with it.
    options = {"timeout": 1} if stop == "timeout" else {}
    job_id = rota.enqueue(conn, "iso.holds.in.a.step", max_attempts=3, **options)
    with _worker(
        conn, db_url, isolation="process", kill_grace_seconds=0.5, lease_seconds=1.5, backoff=FAST
    ):
        wait_for(lambda: did(conn, job_id, "inside"), what="the step to be held")
        if stop == "cancel":
            rota.cancel(conn, [job_id])
        found = until_status(conn, job_id, "done", "cancelled", "dead", "failed")
    [held] = _pids(conn, job_id, "inside")
    steps = conn.execute("SELECT name, attempt FROM rota.job_step WHERE job_id = %s", (job_id,))
    if stop == "timeout":  # retried: the step runs again, and its write commits once
        assert (found["status"], found["attempts"], found["result"]) == ("done", 2, "stored")
        assert found["errors"][0]["error"].startswith("Timeout: the attempt ran longer")
        assert [(s["name"], s["attempt"]) for s in steps] == [("write", 2)]
        [written] = _pids(conn, job_id, "written")
        assert written != held
    else:
        assert (found["status"], found["last_error"]) == ("cancelled", "Cancelled: by request")
        assert steps.fetchall() == []
        assert _pids(conn, job_id, "written") == []


def test_a_step_whose_result_is_not_json_fails_its_job_in_a_child(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "iso.not.json", max_attempts=3)
    with _worker(conn, db_url, isolation="process"):
        found = until_status(conn, job_id, "failed", "dead", "done")
    assert found["attempts"] == 1
    assert found["last_error"].startswith(
        "Permanent: step 'when' returned a value that is not JSON-serialisable:"
    ), found["last_error"]


def _job_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rota-job")]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_stop_leaves_each_job_where_it_stood(conn, db_url, isolation) -> None:
    inside = rota.enqueue(conn, "iso.holds.in.a.step")
    asleep = rota.enqueue(conn, "iso.journey", {"key": "asleep"})
    waiting = rota.enqueue(conn, "iso.journey", {"key": "waiting"})
    with _worker(
        conn, db_url, concurrency=3, isolation=isolation, grace_period_seconds=0.5,
        kill_grace_seconds=0.5,
    ):  # fmt: skip
        until_status(conn, asleep, "waiting")
        until_status(conn, waiting, "waiting")
        wake_due(db_url, now=later(conn, 3601))  # `waiting` now waits for its event
        wait = "SELECT 1 FROM rota.job_wait WHERE job_id = %s AND name = 'event:waiting'"
        wait_for(lambda: conn.execute(wait, (waiting,)).fetchone(), what="the event's wait")
        until_status(conn, waiting, "waiting")
        wait_for(lambda: did(conn, inside, "inside"), what="the step to be held")
    # The stop came while `inside` was held in its step: given back, nothing stored.
    stopped = row(conn, inside)
    assert (stopped["status"], stopped["attempts"]) == ("ready", 0)
    assert stopped["last_error"] == "Released: worker shut down"
    assert [row(conn, j)["status"] for j in (asleep, waiting)] == ["waiting", "waiting"]
    # A thread cannot be killed: it goes on, and its step finds the lease gone.
    conn.execute("INSERT INTO gate VALUES (%s, 'inside')", (inside,))
    wait_for(lambda: not _job_threads(), what="the handler's thread to end")
    assert conn.execute("SELECT 1 FROM rota.job_step WHERE job_id = %s", (inside,)).fetchall() == []
    assert _pids(conn, inside, "written") == []
    # The next worker runs it from the top, the step once.
    with _worker(conn, db_url, isolation=isolation):
        done = until_status(conn, inside, "done", "dead", "failed")
    assert (done["result"], done["attempts"]) == ("stored", 1)
    assert len(_pids(conn, inside, "written")) == 1


@pytest.mark.parametrize("settings", ISOLATIONS.values(), ids=ISOLATIONS.keys())
def test_a_swallowed_suspension_runs_no_step_in_every_isolation(conn, db_url, settings) -> None:
    job_id = rota.enqueue(conn, "iso.swallows.suspension")
    with _worker(conn, db_url, **settings):
        wait_for(lambda: effects(conn, job_id), what="the handler past its suspension")
        assert until_status(conn, job_id, "waiting")["attempts"] == 0
        rota.emit(conn, f"shipped:{job_id}", "1Z999")
        done = until_status(conn, job_id, "done", "failed", "dead")
    assert done["result"] == "1Z999", done["last_error"]
    assert [what for what, _ in effects(conn, job_id)] == ["then Suspended"]
