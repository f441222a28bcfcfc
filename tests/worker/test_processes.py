"""Process isolation (`rota_worker.processes`): the parent decides when a child stops."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import rota
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
