"""Handlers that note when they really start and end (`python -m bench.windows`).

Each writes its own start and end (the host's wall clock, shared by every worker
process on the machine) into `handler_run`. The stubborn ones ignore their stop
until the end of their sleep; killed, a child notes its end first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import psycopg

import rota

_local = threading.local()


def _note(job: rota.Job, column: str, value: float) -> None:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(os.environ["ROTA_DATABASE_URL"], autocommit=True)
    conn.execute(
        "INSERT INTO handler_run (job_id, attempt, started) VALUES (%s, %s, %s)"
        " ON CONFLICT (job_id, attempt) DO UPDATE SET ended = EXCLUDED.started"
        if column == "started"
        else "UPDATE handler_run SET ended = %s WHERE job_id = %s AND attempt = %s",
        (job.id, job.attempts, value) if column == "started" else (value, job.id, job.attempts),
    )


@rota.handler("windows.rated")
def rated(job: rota.Job) -> None:
    _note(job, "started", time.time())
    _note(job, "ended", time.time())


@rota.handler("windows.stubborn")
def stubborn(job: rota.Job) -> None:
    """Runs `seconds`, deaf to its timeout; a child process notes when it is killed."""
    _note(job, "started", time.time())
    if threading.current_thread() is threading.main_thread():

        def killed(*_: object) -> None:
            _note(job, "ended", time.time())
            sys.exit(1)

        signal.signal(signal.SIGTERM, killed)
    time.sleep(job.payload["seconds"])
    _note(job, "ended", time.time())
