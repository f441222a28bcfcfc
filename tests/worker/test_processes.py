"""Process isolation (`rota_worker.processes`): the parent decides when a child stops."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import rota
from rota import logs
from rota.jobs import Status
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _running

HANDLER = """\
import os, pathlib, time
import rota

@rota.handler("outlives.a.term")
def outlives_a_term(job):
    folder = pathlib.Path(job.payload["folder"])
    (folder / "pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 30
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return "went on"
"""


def finished(conn: Any, job_id: int) -> bool:
    found = conn.execute(
        "SELECT status, attempts FROM rota.job WHERE id = %s", (job_id,)
    ).fetchone()
    return found["status"] not in ("ready", "running") or found["attempts"] > 1


def test_a_child_ignores_a_sigterm_its_parent_did_not_send(conn, db_url, tmp_path) -> None:
    # What a SIGTERM to the whole process group does to a child (systemd, `timeout`):
    # the parent's shutdown, not the signal, decides when its handler stops.
    (tmp_path / "terming_handlers.py").write_text(HANDLER)
    sys.path.insert(0, str(tmp_path))
    try:
        import terming_handlers  # noqa: F401

        handlers = {"outlives.a.term": rota.handlers.registered()["outlives.a.term"]}
        job_id = rota.enqueue(conn, "outlives.a.term", {"folder": str(tmp_path)})
        with _running(
            db_url, handlers, concurrency=1, isolation="process",
            handler_modules=["terming_handlers"],
        ):  # fmt: skip
            pid_file = tmp_path / "pid"
            wait_for(pid_file.exists, what="the handler to start")
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            Path(tmp_path / "go").touch()
            wait_for(lambda: finished(conn, job_id), what="the job to end")
    finally:
        sys.path.remove(str(tmp_path))
    assert rota.result(conn, job_id) == (Status.DONE, "went on")


WEARING = """\
import os
import rota

KEPT = []

@rota.handler("wears.a.child")
def wears_a_child(job):
    # Memory a handler keeps by mistake (a module-level cache that only grows).
    KEPT.append(b"\\x01" * (job.payload["megabytes"] * 1024 * 1024))
    return os.getpid()
"""


def _pids_of_runs(conn, db_url, tmp_path, module: str, payloads: list[dict[str, Any]],
                  **settings: Any) -> list[int]:  # fmt: skip
    """Run jobs one at a time in process isolation; the pid each ran in, in order."""
    (tmp_path / f"{module}.py").write_text(WEARING)
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(module)
        handlers = {"wears.a.child": rota.handlers.registered()["wears.a.child"]}
        ids = []
        with _running(
            db_url, handlers, concurrency=1, isolation="process", handler_modules=[module],
            **settings,
        ):  # fmt: skip
            for payload in payloads:  # one after another: each its own child's turn
                ids.append(rota.enqueue(conn, "wears.a.child", payload))
                wait_for(lambda: finished(conn, ids[-1]), what="the job to end")
    finally:
        sys.path.remove(str(tmp_path))
    results = [rota.result(conn, job_id) for job_id in ids]
    assert [status for status, _ in results] == [Status.DONE] * len(ids)
    return [pid for _, pid in results]


def _turns(pids: list[int]) -> list[int]:
    """Which child ran each job, numbered in order of first appearance."""
    seen: dict[int, int] = {}
    return [seen.setdefault(pid, len(seen)) for pid in pids]


def test_a_child_is_replaced_after_its_jobs(conn, db_url, tmp_path) -> None:
    pids = _pids_of_runs(
        conn, db_url, tmp_path, "wearing_by_jobs", [{"megabytes": 0}] * 5, max_jobs_per_child=2
    )
    assert _turns(pids) == [0, 0, 1, 1, 2]


def test_a_child_is_replaced_once_it_holds_too_much_memory(conn, db_url, tmp_path) -> None:
    payloads = [{"megabytes": 1}, {"megabytes": 1}, {"megabytes": 200}, {"megabytes": 1}]
    pids = _pids_of_runs(
        conn, db_url, tmp_path, "wearing_by_memory", payloads, max_child_memory_mb=150
    )
    assert _turns(pids) == [0, 0, 0, 1]


def test_children_live_on_by_default(conn, db_url, tmp_path) -> None:
    pids = _pids_of_runs(conn, db_url, tmp_path, "wearing_not", [{"megabytes": 0}] * 4)
    assert _turns(pids) == [0, 0, 0, 0]


LOGGING = """\
import logging
import rota

@rota.handler("logs.in.a.child")
def logs_in_a_child(job):
    logging.getLogger("shop").info("charged order %s", job.payload["order"])
"""


def test_a_child_logs_as_its_worker_does(conn, db_url, tmp_path, capfd) -> None:
    # A child's log lines had no format and no level set: a handler's info lines
    # were lost, its warnings bare text, even under --log-format json.
    (tmp_path / "logging_handlers.py").write_text(LOGGING)
    sys.path.insert(0, str(tmp_path))
    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        import logging_handlers  # noqa: F401

        handlers = {"logs.in.a.child": rota.handlers.registered()["logs.in.a.child"]}
        logs.configure(logging.INFO, "json")
        job_id = rota.enqueue(conn, "logs.in.a.child", {"order": 17})
        with _running(
            db_url, handlers, concurrency=1, isolation="process",
            handler_modules=["logging_handlers"],
        ):  # fmt: skip
            wait_for(lambda: finished(conn, job_id), what="the job to end")
    finally:
        root.handlers[:], root.level = kept
        sys.path.remove(str(tmp_path))
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line[:1] == "{"]
    [charged] = [line for line in lines if line["logger"] == "shop"]
    assert (charged["level"], charged["message"]) == ("info", "charged order 17")
    assert charged["pid"] != os.getpid()  # written by the child


SLEEPER = """\
import os, pathlib, time
import rota

@rota.handler("sleeps.past.its.stop")
def sleeps_past_its_stop(job):
    (pathlib.Path(job.payload["folder"]) / "pid").write_text(str(os.getpid()))
    time.sleep(30)
"""


def test_a_shutdown_that_gives_back_a_childs_job_logs_no_error(
    conn, db_url, tmp_path, caplog
) -> None:
    # The child is condemned and its pipe closed while a task still waited to
    # read from it: that task's end raised OSError('handle is closed'), logged
    # as an error of the loop's shutdown after every such stop.
    (tmp_path / "sleeping_handlers.py").write_text(SLEEPER)
    sys.path.insert(0, str(tmp_path))
    try:
        import sleeping_handlers  # noqa: F401

        handlers = {"sleeps.past.its.stop": rota.handlers.registered()["sleeps.past.its.stop"]}
        job_id = rota.enqueue(conn, "sleeps.past.its.stop", {"folder": str(tmp_path)})
        with (
            caplog.at_level(logging.ERROR),
            _running(
                db_url, handlers, concurrency=1, isolation="process", grace_period_seconds=0,
                handler_modules=["sleeping_handlers"],
            ),
        ):  # fmt: skip
            wait_for((tmp_path / "pid").exists, what="the handler to start")
    finally:
        sys.path.remove(str(tmp_path))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors
    found = conn.execute("SELECT status, attempts FROM rota.job WHERE id = %s", (job_id,))
    assert found.fetchone() == {"status": "ready", "attempts": 0}
