"""Which workers are alive: the rows they keep in ``rota.worker``.

A worker registers when it starts, refreshes its row on every heartbeat and
deregisters when it stops. A worker that dies without deregistering stops
refreshing, so its row expires after `ttl` seconds and is then deleted by the
next refresh of any other worker; readers count only unexpired rows either way.
The connection that registers and refreshes also holds a presence lock (an
advisory lock PostgreSQL drops when the connection ends), so `live_count`
stops counting a killed worker at once instead of after its row's `ttl`.

The refresh also records the minute's queue sample (`record_sample`), so the
console's charts have a history whenever any worker runs. This module never
touches a job.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rota import sql
from rota.db import ConnOrDsn, connection, fetch_all
from rota.errors import InvalidInput

DEFAULT_TTL_SECONDS = 60.0
"""How long a row stays alive without a refresh: several heartbeats."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker says about itself when it registers."""

    id: str
    concurrency: int
    types: tuple[str, ...] = ()
    host: str = dataclasses.field(default_factory=socket.gethostname)
    pid: int | None = dataclasses.field(default_factory=os.getpid)


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A live worker serving some of a pool's types, and how many jobs it holds."""

    id: str
    host: str
    """The worker's host name: in Kubernetes, its pod's name."""
    concurrency: int
    running: int


@dataclasses.dataclass(frozen=True, slots=True)
class RunningJob:
    id: int
    type: str
    attempts: int
    started_at: datetime | None
    locked_until: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class LiveWorker:
    """A registered worker whose row has not expired, with the jobs it runs now."""

    id: str
    host: str
    pid: int | None
    concurrency: int
    types: tuple[str, ...]
    started_at: datetime
    seen_at: datetime
    expires_at: datetime
    jobs: tuple[RunningJob, ...] = ()
    """The first of the jobs it runs now (see `live`)."""
    running: int = 0
    """How many jobs it runs now."""


def _params(info: WorkerInfo, ttl: float, now: datetime | None) -> dict[str, Any]:
    if info.concurrency < 1:
        raise InvalidInput(f"worker concurrency must be at least 1, not {info.concurrency}")
    if ttl <= 0:
        raise InvalidInput(f"worker ttl must be more than 0 seconds, not {ttl}")
    return {
        "id": info.id,
        "host": info.host,
        "pid": info.pid,
        "concurrency": info.concurrency,
        "types": list(info.types),
        "ttl": ttl,
        "now": now,
    }


def register(
    conn_or_dsn: ConnOrDsn,
    info: WorkerInfo,
    ttl: float = DEFAULT_TTL_SECONDS,
    now: datetime | None = None,
) -> None:
    """Insert (or renew from scratch) the worker's row."""
    with connection(conn_or_dsn) as conn:
        fetch_all(conn, sql.query("worker_register"), _params(info, ttl, now))
        fetch_all(conn, sql.query("worker_presence_hold"), {"id": info.id})


def refresh(
    conn_or_dsn: ConnOrDsn,
    info: WorkerInfo,
    ttl: float = DEFAULT_TTL_SECONDS,
    now: datetime | None = None,
) -> None:
    """A heartbeat: keep the row alive, delete expired rows, sample the queue."""
    with connection(conn_or_dsn) as conn:
        fetch_all(conn, sql.query("worker_refresh"), _params(info, ttl, now))
        fetch_all(conn, sql.query("worker_presence_hold"), {"id": info.id})
        fetch_all(conn, sql.query("worker_expire"), {"now": now})
    record_sample(conn_or_dsn, now=now)


def deregister(conn_or_dsn: ConnOrDsn, info: WorkerInfo, ttl: float = 0.0) -> bool:
    """Delete the worker's row; False when it had none (expired already).

    Takes the same arguments as `register` and `refresh` (`ttl` unused), so a
    worker calls all three the same way."""
    with connection(conn_or_dsn) as conn:
        return bool(fetch_all(conn, sql.query("worker_deregister"), {"id": info.id}))


def expire(conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> list[str]:
    """Delete the rows of workers that stopped refreshing; returns their ids."""
    with connection(conn_or_dsn) as conn:
        return [r["id"] for r in fetch_all(conn, sql.query("worker_expire"), {"now": now})]


def live(conn_or_dsn: ConnOrDsn, now: datetime | None = None, shown: int = 20) -> list[LiveWorker]:
    """The workers alive now, oldest first, each with how many jobs it runs and the
    first `shown` of them."""
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("worker_list"), {"now": now, "shown": shown})
    return [_live(row) for row in rows]


def live_count(conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> int:
    with connection(conn_or_dsn) as conn:
        return int(fetch_all(conn, sql.query("worker_live_count"), {"now": now})[0]["workers"])


def record_sample(conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> bool:
    """Write this minute's queue sample unless it exists; True when this call wrote it.

    The writer of the minute's sample also folds the done counts appended since
    the last (migration 0016)."""
    with connection(conn_or_dsn) as conn:
        written = bool(fetch_all(conn, sql.query("queue_sample_record"), {"now": now}))
        if written:
            fetch_all(conn, sql.query("queue_sample_type_record"), {"now": now})
            fetch_all(conn, sql.query("queue_sample_prune"), {"now": now})
            fetch_all(conn, sql.query("done_counts_fold"))
            fetch_all(conn, sql.query("failure_counts_fold"), {"now": now})
    return written


def _live(row: dict[str, Any]) -> LiveWorker:
    jobs = tuple(
        RunningJob(
            id=int(j["id"]),
            type=j["type"],
            attempts=int(j["attempts"]),
            started_at=_instant(j.get("started_at")),
            locked_until=_instant(j.get("locked_until")),
        )
        for j in row["jobs"]
    )
    fields = {f.name for f in dataclasses.fields(LiveWorker)} - {"jobs", "types", "running"}
    return LiveWorker(
        **{k: row[k] for k in fields},
        types=tuple(row["types"] or ()),
        jobs=jobs,
        running=int(row["running"]),
    )


def _instant(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def loads(
    conn_or_dsn: ConnOrDsn, types: Sequence[str] | None = None, now: datetime | None = None
) -> list[WorkerLoad]:
    """Live workers that claim any of `types` (None: every worker), each with the
    running jobs it holds now: what an autoscaler must not stop."""
    params = {"types": list(types) if types is not None else None, "now": now}
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("worker_loads"), params)
    return [WorkerLoad(r["id"], r["host"], r["concurrency"], int(r["running"])) for r in rows]
