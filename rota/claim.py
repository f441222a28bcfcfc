"""Claiming jobs, holding their leases, and recording how they ended.

The lease is the whole safety story: a worker holds a job while the row is
running, locked_by the worker, at the attempt it claimed. Heartbeats extend the
lease; every write of an outcome is conditional on still holding it, so a worker
whose lease was taken away (reaped, then claimed by another) changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Literal

from rota import sql
from rota.db import Conn, fetch_all
from rota.jobs import Job

Outcome = Literal["done", "failed", "retry", "release"]


@dataclasses.dataclass(frozen=True, slots=True)
class Finish:
    """How one attempt of a job ended, as the worker saw it."""

    job_id: int
    attempts: int
    """The attempt number the worker claimed (the lease is tied to it)."""
    outcome: Outcome
    delay: float = 0.0
    """Seconds before a retried or released job may run again."""
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """A finish that was written: the row's new status and what it took."""

    job_id: int
    status: str
    type: str
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None


def claim(
    conn: Conn,
    worker_id: str,
    limit: int,
    lease_seconds: float,
    types: Sequence[str] | None = None,
    now: datetime | None = None,
) -> list[Job]:
    """Claim up to `limit` ready jobs (of `types`, or any) for `worker_id`."""
    if limit < 1:
        return []
    rows = fetch_all(
        conn,
        sql.query("claim_jobs"),
        {
            "worker": worker_id,
            "limit": limit,
            "lease": lease_seconds,
            "types": list(types) if types is not None else None,
            "now": now,
        },
    )
    return sorted((Job.from_row(row) for row in rows), key=lambda job: (job.run_at, job.id))


def extend_leases(
    conn: Conn,
    worker_id: str,
    held: dict[int, int],
    lease_seconds: float,
    now: datetime | None = None,
) -> set[int]:
    """Extend the leases on `held` (job id -> attempt); return the ids still held."""
    if not held:
        return set()
    rows = fetch_all(
        conn,
        sql.query("extend_leases"),
        {
            "ids": list(held),
            "attempts": list(held.values()),
            "worker": worker_id,
            "lease": lease_seconds,
            "now": now,
        },
    )
    return {row["id"] for row in rows}


def finish(
    conn: Conn, worker_id: str, finishes: Iterable[Finish], now: datetime | None = None
) -> list[Finished]:
    """Write a batch of outcomes; only those whose lease is still held are written."""
    batch = list(finishes)
    if not batch:
        return []
    rows = fetch_all(
        conn,
        sql.query("finish_jobs"),
        {
            "ids": [f.job_id for f in batch],
            "attempts": [f.attempts for f in batch],
            "outcomes": [f.outcome for f in batch],
            "delays": [float(f.delay) for f in batch],
            "errors": [f.error for f in batch],
            "worker": worker_id,
            "now": now,
        },
    )
    return [
        Finished(
            job_id=r["id"],
            status=r["status"],
            type=r["type"],
            attempts=r["attempts"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
        )
        for r in rows
    ]


def complete(conn: Conn, job: Job, now: datetime | None = None) -> bool:
    """Mark `job` done from inside the caller's own transaction.

    For handlers that write their effects and complete the job atomically:
    returns False (and writes nothing) when the lease is no longer held, in which
    case the caller must roll its transaction back.
    """
    if job.locked_by is None:
        return False
    written = finish(conn, job.locked_by, [Finish(job.id, job.attempts, "done")], now)
    return bool(written)


def states(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, object]]:
    """Current status, locked_by and attempts of some jobs (to explain a failed finish)."""
    rows = fetch_all(conn, sql.query("job_states"), {"ids": list(ids)})
    return {row["id"]: row for row in rows}
