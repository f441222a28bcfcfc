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

import psycopg

from rota import limits, sql
from rota.db import Conn, ConnOrDsn, connection, fetch_all
from rota.errors import DatabaseError, InvalidInput
from rota.jobs import Status

ALL_TYPES = "*"
"""The paused_type row that pauses every type."""

RETRYABLE = (Status.DEAD, Status.FAILED, Status.CANCELLED)
"""Statuses `retry` brings back to ready."""

BATCH_SIZE = 1000
"""Rows changed per statement by the levers that take every matching job
(`retry --all`, `cancel --type`): each batch is one short transaction on a
connection Rota opens, so no lock is held on more rows than this."""

DEADLOCK_TRIES = 5
"""How often a cancel's batch is tried when the database ends it in a deadlock.

A cancel locks a job before its children; a child's outcome locks the child,
then (its end's trigger) its parent. When the two meet the database ends one
of them; a cancel so ended is tried again, an outcome is written again by its
worker."""


ARCHIVED = "an archived job stays as it ended"
"""Why a job the archiver moved to rota.job_archive is not acted on."""


@dataclasses.dataclass(frozen=True)
class Missing:
    """Job ids rota.job does not hold, by why."""

    unknown: list[int]
    """Ids of no job at all."""
    archived: list[int]
    """Jobs the archiver moved to rota.job_archive: ended, and kept as they ended."""

    def __bool__(self) -> bool:
        return bool(self.unknown or self.archived)

    def __str__(self) -> str:
        said = [f"no job with id {_ids(self.unknown)}"] if self.unknown else []
        if len(self.archived) == 1:
            said.append(f"job {self.archived[0]} is archived: {ARCHIVED}")
        elif self.archived:
            said.append(f"jobs {_ids(self.archived)} are archived: {ARCHIVED}")
        return "; ".join(said)


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids))


def missing(conn_or_dsn: ConnOrDsn, ids: Sequence[int]) -> Missing:
    """The ids among `ids` that name no job in rota.job, told apart: unknown
    ones and archived ones, each in id order."""
    wanted = sorted(set(ids))
    if not wanted:
        return Missing([], [])
    with connection(conn_or_dsn) as conn:
        found = {r["id"] for r in fetch_all(conn, sql.query("existing_job_ids"), {"ids": wanted})}
        absent = [i for i in wanted if i not in found]
        archived = (
            {r["id"] for r in fetch_all(conn, sql.query("archived_job_ids"), {"ids": absent})}
            if absent
            else set()
        )
    return Missing([i for i in absent if i not in archived], [i for i in absent if i in archived])


@dataclasses.dataclass(frozen=True)
class CancelResult:
    ended: list[int]
    """Ready jobs now cancelled: they will never start."""
    requested: list[int]
    """Running jobs asked to stop: their workers stop them within a heartbeat."""

    @property
    def count(self) -> int:
        return len(self.ended) + len(self.requested)


@dataclasses.dataclass(frozen=True)
class RetryResult:
    revived: list[int]
    """Jobs back to ready, in id order."""
    left: dict[int, str]
    """Jobs asked for and left as they were, each with the reason: "archived",
    "not dead"
    (or not of the statuses asked for), "key held by job N" (a unique_active
    job whose key an active job holds), "key kept for job N" (a newer job of
    the same retry with that key came back instead)."""


def retry(
    conn_or_dsn: ConnOrDsn,
    ids: Sequence[int] = (),
    *,
    all_matching: bool = False,
    statuses: Sequence[Status] = (Status.DEAD,),
    now: datetime | None = None,
) -> list[int]:
    """Jobs of `statuses` (given by id, or all of them) back to ready with fresh
    attempts; returns the ids revived. Others are left alone (`retry_report`
    says why)."""
    return retry_report(
        conn_or_dsn, ids, all_matching=all_matching, statuses=statuses, now=now
    ).revived


def retry_report(
    conn_or_dsn: ConnOrDsn,
    ids: Sequence[int] = (),
    *,
    all_matching: bool = False,
    statuses: Sequence[Status] = (Status.DEAD,),
    now: datetime | None = None,
) -> RetryResult:
    """`retry`, saying which jobs were left and why. With `all_matching`, every
    job of the statuses, oldest first, in batches of BATCH_SIZE (each its own
    transaction on an autocommit connection) until a batch finds fewer; a job
    one batch left is passed over by the next ones."""
    statuses = limits.listed(statuses, "statuses")
    for status in statuses:
        if status not in RETRYABLE:
            raise InvalidInput(f"only {', '.join(RETRYABLE)} jobs can be retried, not {status}")
    wanted = None if all_matching else limits.job_ids(ids)
    limits.clock(now)
    rows: list[dict[str, Any]] = []
    with connection(conn_or_dsn) as conn:
        if wanted is not None:
            params: dict[str, Any] = {"ids": wanted, "statuses": statuses}
            params |= {"limit": None, "skip": None}
            rows = _retry_batch(conn, {**params, "now": now})
        for status in statuses if wanted is None else ():
            skip: list[int] = []  # left by earlier batches: never taken again
            while True:
                params = {"ids": None, "statuses": [status], "limit": BATCH_SIZE, "skip": skip}
                batch = _retry_batch(conn, {**params, "now": now})
                rows += batch
                skip += [row["id"] for row in batch if not row["revived"]]
                if len(batch) < BATCH_SIZE:
                    break
        named = {row["id"] for row in rows}
        archived = missing(conn, [i for i in wanted or () if i not in named]).archived
    left = {row["id"]: _why_left(row) for row in rows if not row["revived"]}
    left |= {id_: "not " + "/".join(statuses) for id_ in wanted or () if id_ not in named}
    left |= dict.fromkeys(archived, "archived")
    return RetryResult(
        sorted(row["id"] for row in rows if row["revived"]), dict(sorted(left.items()))
    )


_RACE_TRIES = 3
"""Runs of a retry batch when a job enqueued meanwhile takes a key it revives."""


def _retry_batch(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    """One retry statement in a savepoint (a transaction of its own on an
    autocommit connection). A unique_active job enqueued while it ran makes its
    UPDATE fail on the key's unique index: run again, it sees that job and
    names it; past _RACE_TRIES such losses, a clear refusal."""
    for _ in range(_RACE_TRIES):
        try:
            with conn.transaction():
                return fetch_all(conn, sql.query("retry_jobs"), params)
        except DatabaseError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise
    raise InvalidInput(
        "jobs with the same unique keys were enqueued while these were retried, "
        f"{_RACE_TRIES} times: retry again"
    )


def _why_left(row: dict[str, Any]) -> str:
    if row["held_by"] is not None:
        return f"key held by job {row['held_by']}"
    if row["newer"] is not None:
        return f"key kept for job {row['newer']}"
    return "left as it was"


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
    written; jobs that already ended, archived ones too, are left alone (and not
    in the result)."""
    wanted = sorted(set(limits.job_ids(ids)))
    if not wanted:
        raise InvalidInput("give at least one job id to cancel")
    limits.clock(now)
    with connection(conn_or_dsn) as conn, conn.transaction():
        absent = missing(conn, wanted)
        if absent.unknown:
            raise InvalidInput(f"no job with id {_ids(absent.unknown)}")
        return _cancel(conn, [i for i in wanted if i not in absent.archived], now)


def cancel_matching(
    conn_or_dsn: ConnOrDsn,
    job_type: str,
    status: Status | None = None,
    now: datetime | None = None,
) -> CancelResult:
    """Cancel every ready, waiting and running job of `job_type` (or only those of
    `status`), and the children of each (durable jobs), as `cancel` does."""
    limits.name(job_type, "job type")
    if status is not None and status not in (Status.READY, Status.RUNNING, Status.WAITING):
        raise InvalidInput(f"only ready, running or waiting jobs can be cancelled, not {status}")
    limits.clock(now)
    wanted = status.value if status is not None else None
    stopped: set[int] = set()
    asked: set[int] = set()
    with connection(conn_or_dsn) as conn:
        # The jobs to cancel, read at once; then cancelled by id in capped
        # batches (their children, and theirs, with them), as `cancel` does.
        params = {"type": job_type, "status": wanted}
        ids = [r["id"] for r in fetch_all(conn, sql.query("cancellable_of_type"), params)]
        for start in range(0, len(ids), BATCH_SIZE):
            done = _cancel(conn, ids[start : start + BATCH_SIZE], now, wanted)
            stopped.update(done.ended)
            asked.update(done.requested)
    return CancelResult(ended=sorted(stopped), requested=sorted(asked))


def _cancel(
    conn: Conn, ids: list[int], now: datetime | None, status: str | None = None
) -> CancelResult:
    params = {"ids": ids, "status": status, "now": now}
    for tried in range(1, DEADLOCK_TRIES + 1):
        try:
            with conn.transaction():
                rows = fetch_all(conn, sql.query("cancel_jobs"), params)
            break
        except DatabaseError as exc:
            deadlock = isinstance(exc.__cause__, psycopg.errors.DeadlockDetected)
            if not deadlock or tried == DEADLOCK_TRIES:
                raise
    return CancelResult(
        ended=[r["id"] for r in rows if r["ended"]],
        requested=[r["id"] for r in rows if not r["ended"]],
    )


def _types(types: Sequence[str] | None) -> list[str] | None:
    if types is None:
        return None
    # As given, white space and all: the types rota.enqueue wrote.
    checked = limits.names(types, "job types")
    if not checked:
        raise InvalidInput("give job types, or all of them")
    for t in checked:
        if t.strip() == ALL_TYPES:
            raise InvalidInput(f"not a job type: {t!r} (to mean every type, give types=None)")
    return checked


def pause(
    conn_or_dsn: ConnOrDsn, types: Sequence[str] | None, now: datetime | None = None
) -> list[str]:
    """Pause job types (None: every type, present and future); returns those newly paused."""
    checked = _types(types)
    params = {"types": checked if checked is not None else [ALL_TYPES], "now": limits.clock(now)}
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
