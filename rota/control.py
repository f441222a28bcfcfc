"""Levers on the queue: retry ended jobs, cancel jobs, pause and resume job types.

Cancelling a ready job ends it at once (status cancelled, it never starts).
Cancelling a running job only asks: its worker learns of the request from its
next heartbeat and stops the handler the way a timeout does; a handler that
finishes first keeps its outcome. A paused type is claimed by no worker until
it is resumed; its running jobs finish and its schedules keep enqueueing.
Pauses live in the database, so they survive restarts of every process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rota import limits, sql
from rota.db import Conn, ConnOrDsn, connection, fetch_all
from rota.errors import InvalidInput
from rota.jobs import Status

ALL_TYPES = "*"
"""The paused_type row that pauses every type."""

RETRYABLE = (Status.DEAD, Status.FAILED, Status.CANCELLED)
"""Statuses `retry` brings back to ready."""

BATCH_SIZE = 1000
"""Rows changed per statement by the levers that take every matching job
(`retry --all`, `cancel --type`): each batch is one short transaction on a
connection Rota opens, so no lock is held on more rows than this."""


@dataclasses.dataclass(frozen=True)
class CancelResult:
    ended: list[int]
    """Ready jobs now cancelled: they will never start."""
    requested: list[int]
    """Running jobs asked to stop: their workers stop them within a heartbeat."""

    @property
    def count(self) -> int:
        return len(self.ended) + len(self.requested)


def retry(
    conn_or_dsn: ConnOrDsn,
    ids: Sequence[int] = (),
    *,
    all_matching: bool = False,
    statuses: Sequence[Status] = (Status.DEAD,),
    now: datetime | None = None,
) -> list[int]:
    """Jobs of `statuses` (given by id, or all of them) back to ready with fresh
    attempts; returns the ids revived. Others are left alone."""
    for status in statuses:
        if status not in RETRYABLE:
            raise InvalidInput(f"only {', '.join(RETRYABLE)} jobs can be retried, not {status}")
    if all_matching:
        with connection(conn_or_dsn) as conn:
            return sorted(
                id_
                for status in statuses
                for id_ in _batches(
                    conn, "retry_jobs", {"statuses": [status], "ids": None, "now": now}
                )
            )
    params = {"ids": limits.job_ids(ids), "statuses": list(statuses), "limit": None, "now": now}
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("retry_jobs"), params)
    return [row["id"] for row in rows]


def _batches(conn: Conn, query: str, params: dict[str, Any]) -> list[int]:
    """Run a capped batch statement until one changes fewer than BATCH_SIZE rows
    (the changed rows leave what the statement matches); the ids changed."""
    changed: list[int] = []
    while True:
        rows = fetch_all(conn, sql.query(query), {**params, "limit": BATCH_SIZE})
        changed += [r["id"] for r in rows]
        if len(rows) < BATCH_SIZE:
            return changed


def retry_dead(
    conn_or_dsn: ConnOrDsn,
    ids: Sequence[int] = (),
    *,
    all_dead: bool = False,
    now: datetime | None = None,
) -> list[int]:
    """Dead jobs back to ready with fresh attempts; returns the ids revived."""
    return retry(conn_or_dsn, ids, all_matching=all_dead, now=now)


def cancel(conn_or_dsn: ConnOrDsn, ids: Sequence[int], now: datetime | None = None) -> CancelResult:
    """Cancel jobs by id. An id that names no job is refused before anything is
    written; jobs that already ended are left alone (and not in the result)."""
    wanted = sorted(set(limits.job_ids(ids)))
    if not wanted:
        raise InvalidInput("give at least one job id to cancel")
    with connection(conn_or_dsn) as conn, conn.transaction():
        found = {r["id"] for r in fetch_all(conn, sql.query("existing_job_ids"), {"ids": wanted})}
        unknown = [i for i in wanted if i not in found]
        if unknown:
            raise InvalidInput(f"no job with id {', '.join(map(str, unknown))}")
        return _cancel(conn, wanted, now)


def cancel_matching(
    conn_or_dsn: ConnOrDsn,
    job_type: str,
    status: Status | None = None,
    now: datetime | None = None,
) -> CancelResult:
    """Cancel every ready, waiting and running job of `job_type` (or only those of `status`)."""
    limits.name(job_type, "job type")
    if status is not None and status not in (Status.READY, Status.RUNNING, Status.WAITING):
        raise InvalidInput(f"only ready, running or waiting jobs can be cancelled, not {status}")
    params = {"type": job_type, "now": now}
    ended: list[int] = []
    requested: list[int] = []
    with connection(conn_or_dsn) as conn:
        if status in (None, Status.READY):
            ended = _batches(conn, "cancel_ready_of_type", params)
        if status in (None, Status.WAITING):
            ended += _batches(conn, "cancel_waiting_of_type", params)
        if status in (None, Status.RUNNING):
            after = 0
            while True:
                query = sql.query("cancel_running_of_type")
                batch = [
                    r["id"]
                    for r in fetch_all(conn, query, {**params, "after": after, "limit": BATCH_SIZE})
                ]
                requested += batch
                if len(batch) < BATCH_SIZE:
                    break
                after = max(batch)
    return CancelResult(ended=sorted(ended), requested=sorted(requested))


def _cancel(conn: Conn, ids: list[int], now: datetime | None) -> CancelResult:
    params = {"ids": ids, "type": None, "status": None, "now": now}
    rows = fetch_all(conn, sql.query("cancel_jobs"), params)
    return CancelResult(
        ended=[r["id"] for r in rows if r["ended"]],
        requested=[r["id"] for r in rows if not r["ended"]],
    )


def _types(types: Sequence[str] | None) -> list[str] | None:
    if types is None:
        return None
    checked = [t.strip() for t in limits.names(types, "job types")]
    if not checked:
        raise InvalidInput("give job types, or all of them")
    for t in checked:
        if t == ALL_TYPES:
            raise InvalidInput(f"not a job type: {t!r} (to mean every type, say all)")
    return checked


def pause(
    conn_or_dsn: ConnOrDsn, types: Sequence[str] | None, now: datetime | None = None
) -> list[str]:
    """Pause job types (None: every type, present and future); returns those newly paused."""
    checked = _types(types)
    params = {"types": checked if checked is not None else [ALL_TYPES], "now": now}
    with connection(conn_or_dsn) as conn:
        return [r["type"] for r in fetch_all(conn, sql.query("pause_types"), params)]


def resume(conn_or_dsn: ConnOrDsn, types: Sequence[str] | None) -> list[str]:
    """Resume job types (None: everything paused, the pause of all types included).

    A type stays paused while every type is (the pause of all types is its own row).
    Returns the pauses lifted.
    """
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("resume_types"), {"types": _types(types)})
    return [r["type"] for r in rows]


def paused(conn_or_dsn: ConnOrDsn) -> list[str]:
    """The paused types, ``*`` standing for every type."""
    with connection(conn_or_dsn) as conn:
        return [r["type"] for r in fetch_all(conn, sql.query("paused_types"))]
