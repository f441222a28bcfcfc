"""Read-only questions about the queue: job rows, and how far behind it is.

Used by the CLI, the operator's autoscaler and the metrics; every query here
walks a partial index, never the whole table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rota import sql
from rota.db import ConnOrDsn, connection, fetch_all
from rota.errors import InvalidInput, JobNotFound
from rota.jobs import Status


@dataclasses.dataclass(frozen=True)
class QueueAge:
    oldest_ready_age_seconds: float
    """Seconds since the oldest job that could run now became runnable (0 if none)."""
    ready_jobs: int
    """Jobs that could run now (status ready, run_at <= now)."""
    running_jobs: int = 0
    """Jobs being run now (status running)."""


def queue_age(
    conn_or_dsn: ConnOrDsn, types: Sequence[str] | None = None, now: datetime | None = None
) -> QueueAge:
    with connection(conn_or_dsn) as conn:
        row = fetch_all(
            conn,
            sql.query("queue_age"),
            {"types": list(types) if types is not None else None, "now": now},
        )[0]
    return QueueAge(
        max(float(row["oldest_ready_age_seconds"]), 0.0),
        int(row["ready_jobs"]),
        int(row["running_jobs"]),
    )


def list_jobs(
    conn_or_dsn: ConnOrDsn,
    status: str | None = None,
    job_type: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    if status is not None and status not in {s.value for s in Status}:
        valid = ", ".join(s.value for s in Status)
        raise InvalidInput(f"unknown status {status!r} (one of: {valid})")
    with connection(conn_or_dsn) as conn:
        return fetch_all(
            conn, sql.query("list_jobs"), {"status": status, "type": job_type, "limit": limit}
        )


def get_job(conn_or_dsn: ConnOrDsn, job_id: int) -> dict[str, Any]:
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("get_job"), {"id": job_id})
    if not rows:
        raise JobNotFound(f"no job with id {job_id}")
    return rows[0]


def retry_dead(
    conn_or_dsn: ConnOrDsn,
    ids: Sequence[int] = (),
    *,
    all_dead: bool = False,
    now: datetime | None = None,
) -> list[int]:
    """Dead jobs back to ready with fresh attempts; returns the ids revived."""
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(
            conn, sql.query("retry_dead"), {"ids": list(ids), "all": all_dead, "now": now}
        )
    return [row["id"] for row in rows]
