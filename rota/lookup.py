"""Finding jobs: one job's whole row, or the newest jobs matching a filter.

Read-only; every query walks an index, never the whole table.
"""

from __future__ import annotations

from typing import Any

from rota import limits, sql
from rota.db import ConnOrDsn, connection, fetch_all
from rota.errors import InvalidInput, JobNotFound
from rota.jobs import Job, Status
from rota.reading import json_of


def status_named(name: str) -> Status:
    """The status called `name`; InvalidInput naming the valid ones otherwise."""
    try:
        return Status(name)
    except ValueError:
        valid = ", ".join(Status)
        raise InvalidInput(f"unknown status {name!r} (one of: {valid})") from None


def list_jobs(
    conn_or_dsn: ConnOrDsn,
    status: str | None = None,
    job_type: str | None = None,
    limit: int = 50,
) -> list[Job]:
    """The newest jobs first, of one status and type when given."""
    checked = status_named(status) if status is not None else None
    if job_type is not None:
        limits.name(job_type, "job type")
    limits.whole(limit, "limit")
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(
            conn, sql.query("list_jobs"), {"status": checked, "type": job_type, "limit": limit}
        )
    return [Job.from_row(row) for row in rows]


def get_job(conn_or_dsn: ConnOrDsn, job_id: int) -> Job:
    """The job with this id, its whole row; `JobNotFound` when there is none."""
    return Job.from_row(job_row(conn_or_dsn, job_id))


def job_row(conn_or_dsn: ConnOrDsn, job_id: int, archived: bool = False) -> dict[str, Any]:
    """One job's whole row: a `Job`'s columns and the others (result, errors, group).
    With `archived`, a job the archiver moved is read from the archive (its row
    has `archived_at`)."""
    limits.job_id(job_id)
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("get_job"), {"id": job_id})
        if not rows and archived:
            rows = fetch_all(conn, sql.query("get_archived_job"), {"id": job_id})
    if not rows:
        raise JobNotFound(f"no job with id {job_id}")
    return rows[0]


def result(conn_or_dsn: ConnOrDsn, job_id: int) -> tuple[Status, Any]:
    """A job's status and its handler's return value (None until it is done, and
    for a handler that returned None), archived or not."""
    found = outcome(conn_or_dsn, job_id)
    return found["status"], found["result"]


def outcome(conn_or_dsn: ConnOrDsn, job_id: int) -> dict[str, Any]:
    """What became of a job, archived or not: its type, status, payload, result,
    errors (decoded), attempts, last worker (locked_by) and times."""
    limits.job_id(job_id)
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("job_outcome"), {"id": job_id})
    if not rows:
        raise JobNotFound(f"no job with id {job_id}")
    row = rows[0]
    for name in ("payload", "result", "errors"):
        row[name] = None if row[name] is None else json_of(row[name])
    row["status"] = Status.stored(row["status"])
    return row
