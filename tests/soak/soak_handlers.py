"""Handlers the soak and failover tests run in real `rota worker` processes.

`soak.effect` makes its effect exactly once: the effect row and the job's
completion commit in one transaction of the handler's own (`rota.complete`).
A late finisher (its lease taken away while it ran, its timeout passed, or its
job cancelled) has its completion refused, rolls its effect back, and leaves a
note in `soak_refused` instead. Every attempt that starts says so first, in
`soak_started` (a job claimed ahead may be held and given back unstarted). One
whose completion the server's restart cut off notes that in the file named by
ROTA_SOAK_INTERRUPTED (the database is away), when it is set.

`failover.run` has no transaction to protect it: it appends one line per run to
the file named by ROTA_RUNS_LOG, which survives a database failover, so the
runs that happened again can be counted.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg

import rota
from rota.errors import DatabaseUnavailable

DSN = os.environ.get("ROTA_DATABASE_URL", "")


class _Refused(Exception):
    """rota.complete wrote nothing: the lease is no longer ours."""


_local = threading.local()


def _connection() -> psycopg.Connection[tuple[object, ...]]:
    """This handler thread's connection, opened again after the server went away."""
    conn: psycopg.Connection[tuple[object, ...]] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(DSN, autocommit=True, connect_timeout=5)
        _local.conn = conn
    return conn


@rota.handler("soak.effect")
def effect_once(job: rota.Job) -> None:
    conn = _connection()
    conn.execute(
        "INSERT INTO soak_started (job_id, worker, attempt) VALUES (%s, %s, %s)",
        (job.id, job.locked_by, job.attempts),
    )
    payload = job.payload or {}
    # "first_ms": the first attempt outlives its timeout and, like a handler that
    # never looks at job.cancelled, tries to complete anyway.
    ms = payload.get("first_ms", 0) if job.attempts == 1 else 0
    time.sleep(float(ms or payload.get("ms", 0)) / 1000)
    conn = _connection()  # again: the server may have restarted meanwhile
    try:
        with conn.transaction():
            conn.execute(
                "INSERT INTO soak_effect (job_id, worker, attempt) VALUES (%s, %s, %s)",
                (job.id, job.locked_by, job.attempts),
            )
            if not rota.complete(conn, job):
                raise _Refused
    except _Refused:
        conn.execute(
            "INSERT INTO soak_refused (job_id, worker, attempt) VALUES (%s, %s, %s)",
            (job.id, job.locked_by, job.attempts),
        )
        raise RuntimeError("lease lost: effect rolled back") from None
    except (psycopg.OperationalError, DatabaseUnavailable):
        _note_interrupted(job)
        raise


def _note_interrupted(job: rota.Job) -> None:
    """The completion never reached the database: say so where it survives that."""
    path = os.environ.get("ROTA_SOAK_INTERRUPTED")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{job.id} {job.locked_by} {job.attempts}\n".encode())
        finally:
            os.close(fd)


@rota.handler("soak.noop")
def noop(job: rota.Job) -> None:
    return None


@rota.handler("failover.run")
def run_and_log(job: rota.Job) -> None:
    time.sleep(float((job.payload or {}).get("ms", 0)) / 1000)
    line = f"{job.id} {job.attempts} {job.locked_by}\n"
    fd = os.open(os.environ["ROTA_RUNS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
