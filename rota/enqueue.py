"""Putting jobs on the queue: one job, or thousands in one round trip.

Enqueueing inside the caller's transaction is supported: pass the connection and
nothing is committed for you, so the job exists if and only if the caller's
business rows do. The connection may be psycopg's (`AsyncConnection` for the
async functions) or an ORM's (see rota.db). Each call is one round trip. A
duplicate idempotency key never makes a second row; it gives the id of the row
that holds the key. A key given with `unique_for` holds only for that many
seconds after its first job, and one given with `unique_active` only while its
job is ready, running or waiting (see `_unique_steps`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb

from rota import limits, sql, tracing
from rota.db import (
    AConn,
    AConnOrDsn,
    Conn,
    ConnOrDsn,
    aconnection,
    afetch_all,
    connection,
    fetch_all,
)
from rota.errors import DatabaseError, InvalidInput
from rota.handlers import default_priority
from rota.jobs import NewJob
from rota.settings import QueueSettings

_DEFAULTS = QueueSettings()


def enqueue(
    conn_or_dsn: ConnOrDsn,
    job_type: str,
    payload: Any = None,
    *,
    key: str | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    timeout: float | None = None,
    group: str | None = None,
    unique_for: float | None = None,
    unique_active: bool = False,
    settings: QueueSettings = _DEFAULTS,
    now: datetime | None = None,
) -> int:
    """Enqueue one job and return its id (the existing id for a known key).

    `priority` is 0 (runs first) to 9; None takes the default of the type's
    handler when one is registered in this process, else 0. `timeout` is the
    seconds each attempt may run (None: the handler's or the worker's default).
    `group` is the job's concurrency group (a tenant, an account), stored with it.
    With `unique_for` (seconds) the key gives the existing id only within that
    window after its first job; with `unique_active` only while that job is
    ready, running or waiting.
    """
    fields = (job_type, payload, key, run_at, delay, max_attempts, priority, timeout, group)
    job = NewJob(*fields, unique_for=unique_for, unique_active=unique_active)
    return enqueue_many(conn_or_dsn, [job], settings=settings, now=now)[0]


def enqueue_many(
    conn_or_dsn: ConnOrDsn,
    jobs: Sequence[NewJob],
    *,
    settings: QueueSettings = _DEFAULTS,
    now: datetime | None = None,
) -> list[int]:
    """Enqueue a batch in one statement; ids in input order.

    Jobs with `unique_for` or `unique_active` take a statement each, in the
    same transaction as the others.
    """
    if not _jobs(jobs, settings, now):
        return []
    with tracing.producer(jobs) as sent:
        steps = _steps(jobs, settings, now, sent.context if sent is not None else None)
        step = next(steps)  # every job checked before the connection is touched
        with _rights_said(), connection(conn_or_dsn) as conn, _atomic(conn, _statements(jobs)):
            try:
                while True:
                    step = steps.send(fetch_all(conn, *step))
            except StopIteration as done:
                ids: list[int] = done.value
        if sent is not None:
            sent.sent(ids)
    return ids


Step = tuple[LiteralString, dict[str, Any]]
"""A statement to run and its parameters; the rows it returns are sent back."""
Steps = Generator[Step, list[dict[str, Any]], list[int]]


def _steps(
    jobs: Sequence[NewJob], settings: QueueSettings, now: datetime | None, context: Any
) -> Steps:
    """The statements that enqueue `jobs`, for the sync and the async drivers alike.

    Without unique jobs: one statement for the batch (a second only when a key
    was taken by a transaction the first could not see). With them: the others
    in one statement, then one statement per unique job (two when its key is
    held); the driver runs them in one transaction.
    """
    plain = [i for i, job in enumerate(jobs) if not _is_unique(job)]
    if len(plain) < len(jobs):  # nothing written before every job is checked
        for job in jobs:
            _checked(job, settings)
    ids: dict[int, int] = {}
    if plain:
        subset = [jobs[i] for i in plain]
        statement, params = _statement(subset, settings, now)
        params["trace_context"] = context
        found = _ids((yield statement, params))
        if None in found:
            held = yield sql.query("ids_for_keys"), _missing(subset, found)
            found = _filled(subset, found, held)
        ids.update(zip(plain, _known(found), strict=True))
    for i, job in enumerate(jobs):
        if i not in ids:
            params = _one_params(job, _checked(job, settings), _priority(job), settings, now)
            params["trace_context"] = context
            ids[i] = yield from _unique_steps(job, params)
    return [ids[i] for i in range(len(jobs))]


def _is_unique(job: NewJob) -> bool:
    return job.unique_for is not None or job.unique_active


def _statements(jobs: Sequence[NewJob]) -> bool:
    """Whether the jobs take more than one writing statement: a batch with unique jobs."""
    return len(jobs) > 1 and any(_is_unique(job) for job in jobs)


@contextlib.contextmanager
def _rights_said() -> Iterator[None]:
    """A role refused the write as a `DatabaseError` that says which enqueue it
    may use: these functions write rota.job themselves, which a role granted
    `--grant-enqueue` may not; it calls the SQL function rota.enqueue, whose
    owner writes the row."""
    try:
        yield
    except DatabaseError as exc:
        if not isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
            raise
        raise DatabaseError(
            f"{exc}: Rota's enqueue (Python, `rota enqueue`) writes rota.job itself, which"
            " needs `rota migrate --grant-worker` (or --grant); a role granted --grant-enqueue"
            " enqueues through the SQL function rota.enqueue: SELECT rota.enqueue('type',"
            " '{...}')"
        ) from exc.__cause__


@contextlib.contextmanager
def _atomic(conn: Conn, several: bool) -> Iterator[None]:
    """When `several` statements write, the block as one transaction: its own on
    an autocommit connection; else the caller's, which commits or rolls back the
    block with the rest. One writing statement needs no block."""
    if not several or not conn.autocommit:
        yield
        return
    with conn.transaction():
        yield


@contextlib.asynccontextmanager
async def _aatomic(conn: AConn, several: bool) -> AsyncIterator[None]:
    """`_atomic` for asyncio."""
    if not several or not conn.autocommit:
        yield
        return
    async with conn.transaction():
        yield


def _unique_steps(
    job: NewJob, params: dict[str, Any]
) -> Generator[Step, list[dict[str, Any]], int]:
    """One job whose key is unique for a window or while active: its id, or the holder's.

    The insert and the look for the holder are two statements, so the look
    sees a holder that committed after the insert's snapshot; a holder that
    finished in between leaves the key free, and the insert is tried again.
    """
    insert, holder = (
        ("enqueue_job", "unique_active_holder")
        if job.unique_active
        else ("enqueue_unique_for", "unique_for_holder")
    )
    params.update(
        idempotency_key=None,
        unique_key=job.key,
        unique_active=job.unique_active,
        unique_for=job.unique_for,
    )
    for _ in range(_UNIQUE_TRIES):
        rows = yield sql.query(insert), params
        if rows:
            return int(rows[0]["id"])
        rows = yield sql.query(holder), {"key": job.key}
        if rows:
            return int(rows[0]["id"])
    raise InvalidInput(  # pragma: no cover - the key changed hands at every try
        f"the key {job.key!r} was taken and freed concurrently {_UNIQUE_TRIES} times; enqueue again"
    )


_UNIQUE_TRIES = 5


async def enqueue_async(
    aconn_or_dsn: AConnOrDsn,
    job_type: str,
    payload: Any = None,
    *,
    key: str | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    timeout: float | None = None,
    group: str | None = None,
    unique_for: float | None = None,
    unique_active: bool = False,
    settings: QueueSettings = _DEFAULTS,
    now: datetime | None = None,
) -> int:
    """`enqueue` for asyncio, on a psycopg `AsyncConnection` (in its transaction, never
    committed for it), a SQLAlchemy `AsyncConnection` or `AsyncSession`, or a DSN."""
    fields = (job_type, payload, key, run_at, delay, max_attempts, priority, timeout, group)
    job = NewJob(*fields, unique_for=unique_for, unique_active=unique_active)
    return (await enqueue_many_async(aconn_or_dsn, [job], settings=settings, now=now))[0]


async def enqueue_many_async(
    aconn_or_dsn: AConnOrDsn,
    jobs: Sequence[NewJob],
    *,
    settings: QueueSettings = _DEFAULTS,
    now: datetime | None = None,
) -> list[int]:
    """`enqueue_many` for asyncio: the same statements, ids in input order."""
    if not _jobs(jobs, settings, now):
        return []
    with tracing.producer(jobs) as sent:
        steps = _steps(jobs, settings, now, sent.context if sent is not None else None)
        step = next(steps)  # every job checked before the connection is touched
        with _rights_said():
            async with aconnection(aconn_or_dsn) as conn, _aatomic(conn, _statements(jobs)):
                try:
                    while True:
                        step = steps.send(await afetch_all(conn, *step))
                except StopIteration as done:
                    ids: list[int] = done.value
        if sent is not None:
            sent.sent(ids)
    return ids


def _jobs(jobs: Any, settings: Any, now: Any) -> bool:
    """Whether there are jobs to enqueue; InvalidInput when `jobs` is not a list of
    them, or the settings or the clock are not what enqueue takes. Each job's
    fields are checked where its statement is made (`limits.new_job`)."""
    if isinstance(jobs, str | bytes) or not isinstance(jobs, Sequence):
        raise InvalidInput("enqueue_many takes a list of NewJob values")
    for job in jobs:
        if not isinstance(job, NewJob):
            raise InvalidInput(f"enqueue_many takes NewJob values, not {type(job).__name__}")
    if not isinstance(settings, QueueSettings):
        raise InvalidInput(f"settings must be a QueueSettings, not {type(settings).__name__}")
    limits.clock(now)
    return bool(jobs)


def _statement(
    jobs: Sequence[NewJob], settings: QueueSettings, now: datetime | None
) -> tuple[LiteralString, dict[str, Any]]:
    """The statement that enqueues `jobs` and its parameters, everything checked first."""
    payloads = [_checked(job, settings) for job in jobs]
    priorities = [_priority(job) for job in jobs]
    # Without a key no row can conflict: a plain INSERT, no ON CONFLICT.
    keyed = any(job.key is not None for job in jobs)
    if len(jobs) == 1:
        # One job: a single-row INSERT, a third of the batch statement's time.
        one = _one_params(jobs[0], payloads[0], priorities[0], settings, now)
        return sql.query("enqueue_job" if keyed else "enqueue_job_without_key"), one
    params = _batch_params(jobs, payloads, priorities, settings, now)
    return sql.query("enqueue_jobs" if keyed else "enqueue_jobs_without_keys"), params


def _ids(rows: list[dict[str, Any]]) -> list[int | None]:
    """Ids in input order; None for a key the statement found held by a row it could
    not see (the single-row INSERT returns no row for a known key)."""
    return [row["id"] for row in rows] or [None]


def _missing(jobs: Sequence[NewJob], ids: list[int | None]) -> dict[str, Any]:
    # A concurrent transaction inserted the key after our statement's snapshot
    # was taken (or, for one job, before it); a new statement sees its row.
    return {"keys": [job.key for job, id_ in zip(jobs, ids, strict=True) if id_ is None]}


def _filled(
    jobs: Sequence[NewJob], ids: list[int | None], found: list[dict[str, Any]]
) -> list[int | None]:
    by_key = {r["idempotency_key"]: r["id"] for r in found}
    return [
        id_ if id_ is not None else by_key.get(job.key) for job, id_ in zip(jobs, ids, strict=True)
    ]


def _known(ids: list[int | None]) -> list[int]:
    if None in ids:  # pragma: no cover - the key's holder rolled back between our two statements
        raise InvalidInput("a job with that key was being inserted concurrently; enqueue again")
    return [int(id_) for id_ in ids if id_ is not None]


def _batch_params(
    jobs: Sequence[NewJob],
    payloads: list[Jsonb],
    priorities: list[int],
    settings: QueueSettings,
    now: datetime | None,
) -> dict[str, Any]:
    return {
        "types": [job.type for job in jobs],
        "payloads": payloads,
        "keys": [job.key for job in jobs],
        "run_ats": [job.run_at for job in jobs],
        "delays": [None if job.delay is None else float(job.delay) for job in jobs],
        "max_attempts": [job.max_attempts for job in jobs],
        "priorities": priorities,
        "timeouts": [job.timeout for job in jobs],
        # NULL when no job has a group: unnest pads it, and no list is sent.
        "groups": [job.group for job in jobs] if any(j.group is not None for j in jobs) else None,
        "default_max_attempts": settings.default_max_attempts,
        "trace_context": None,
        "now": now,
    }


def _one_params(
    job: NewJob, payload: Jsonb, priority: int, settings: QueueSettings, now: datetime | None
) -> dict[str, Any]:
    return {
        "type": job.type,
        "payload": payload,
        "key": job.key,
        "idempotency_key": job.key,
        "unique_key": None,
        "unique_active": False,
        "run_at": job.run_at,
        "delay": None if job.delay is None else float(job.delay),
        "max_attempts": job.max_attempts,
        "priority": priority,
        "timeout": job.timeout,
        "group": job.group,
        "default_max_attempts": settings.default_max_attempts,
        "trace_context": None,
        "now": now,
    }


def _priority(job: NewJob) -> int:
    return job.priority if job.priority is not None else default_priority(job.type)


def _checked(job: NewJob, settings: QueueSettings) -> Jsonb:
    """Validate one job before anything is written; return its payload for the driver."""
    encoded = limits.new_job(job, settings.max_payload_bytes)
    return Jsonb(job.payload, dumps=lambda _: encoded)
