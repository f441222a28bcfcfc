"""The SQL gateway of claims, leases and outcomes: the statements, their
parameters and their round trips (rows become jobs in `rota.decoding`; the
types they share live in `rota.attempt`; a claim's start in `rota.floor`).

The lease is the whole safety story: a worker holds a job while the row is
running, locked_by the worker, under the claim it made (`claims`, the claim's
number: unlike the attempt number, nothing lowers it). Heartbeats extend the
lease; every write of an outcome is conditional on still holding it, so a worker
whose lease was taken away (reaped, then claimed by another) changes nothing.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, LiteralString, cast

from psycopg import Cursor, pq
from psycopg import sql as pgsql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from rota import limits, sql
from rota.attempt import Attempt, Key, Lease
from rota.db import Conn, errors_wrapped, fetch_all
from rota.decoding import _STATUS, claim_cursor, jobs_of
from rota.errors import InvalidInput
from rota.jobs import Job, Outcome, Status

__all__ = ["Attempt", "Key", "Lease", "claim", "complete", "extend_leases", "write_and_claim"]


def claim(
    conn: Conn,
    worker_id: str,
    limit: int,
    lease_seconds: float,
    types: Sequence[str] | None = None,
    now: datetime | None = None,
    since: Sequence[datetime | None] | None = None,
    limited_since: Mapping[str, Sequence[datetime | None]] | None = None,
) -> list[Job]:
    """Claim up to `limit` ready jobs (of `types`, or any) for `worker_id`.

    `since`, one run_at per priority (None: from the first), is where each
    priority's walk starts; `limited_since`, the same for the jobs without a
    group of each limited type (see rota.floor.Floor).
    """
    if limit < 1:
        return []
    params = _claim_params(worker_id, limit, lease_seconds, now, since, limited_since)
    query = _claim_query(types)
    with errors_wrapped(), _keyed(conn, query, params, tuple_row, binary=True, claim=True) as cur:
        return jobs_of(cur)


def _keyed(
    conn: Conn,
    query: LiteralString,
    params: Any,
    row_factory: Any,
    *,
    binary: bool = False,
    claim: bool = False,
) -> Cursor[Any]:
    """Run one hot statement so that its plan reaches rota.job through an index
    (see `_KEYED`) and return its cursor, rows ready.

    On an idle autocommit connection the setting, the statement and the commit
    travel in one round trip (see `_one_trip`); inside a transaction of the
    caller's, or on a connection that is not autocommit, the statement runs
    under the caller's own settings and transaction. The cursor binds its
    parameters on the server whatever the connection's own cursor class
    (Django's is client-side); `binary` asks for the rows in binary; `claim`
    reads them as a claim's (see rota.decoding).
    """
    cur = claim_cursor(conn, row_factory) if claim else Cursor(conn, row_factory=row_factory)
    if not conn.autocommit or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        cur.execute(query, params, binary=binary)
        return cur
    with _one_trip(conn):
        conn.execute(_KEYED)
        cur.execute(query, params, binary=binary)
    return cur


@contextlib.contextmanager
def _one_trip(conn: Conn) -> Iterator[None]:
    """The statements run in the block as one transaction, in one round trip.

    On an idle autocommit connection: a pipeline whose statements run in the
    implicit transaction that its one Sync ends, committed, or rolled back
    when one of them fails (the ones after it are not run). psycopg's
    `transaction()` in a pipeline waits for the answer to its BEGIN, its COMMIT
    and the pipeline's end: four round trips where one does (an idle worker's
    claim took 1.35 ms against 0.94; tests/integration/test_round_trips.py
    counts them). Elsewhere: a pipeline in a transaction (a savepoint of the
    caller's, when there is one).
    """
    if conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        with conn.pipeline():
            yield
        return
    with conn.pipeline(), conn.transaction():
        yield


_KEYED = b"SELECT set_config('enable_seqscan', 'off', true)"
"""The hot statements reach their rows through an index whatever the statistics say.

psycopg prepares a statement on its sixth run, and PostgreSQL may keep its
generic plan until the table's statistics next change. Made while rota.job
was small (a new queue, or one left nearly empty), that plan could read the
whole table, cheapest at a hundred rows, and kept doing so as the table grew,
until autovacuum's next ANALYZE (a claim went from 2 to 9 ms over 120,000
rows; tests/integration/test_young_plans.py). `enable_seqscan = off` makes a
sequential scan the last resort, never forbidden: a statement with no index to
use still runs. The setting is local: it ends with the transaction (written as
set_config, which also holds in the implicit transaction of a pipeline, where
SET LOCAL would warn that it is outside a transaction block)."""


def _claim_query(types: Sequence[str] | None) -> LiteralString:
    return _claim_statement(None if types is None else tuple(types))


@functools.lru_cache(maxsize=64)
def _claim_statement(types: tuple[str, ...] | None) -> LiteralString:
    """The claim, with `types` written into the statement rather than bound.

    A worker claims the same types for as long as it runs, so its claim is one
    statement whose plans are all made knowing them. Bound, the types are
    unknown to a generic plan (PostgreSQL may switch to one after psycopg
    prepares the statement), and a generic claim walks the claim index past
    every ready job of other types to reach the worker's own: 30,000 rows per
    claim behind a backlog of 30,000 (tests/integration/test_plans.py).
    """
    return with_types(sql.query("claim_jobs"), types)


def with_types(text: LiteralString, types: tuple[str, ...] | None) -> LiteralString:
    if types is None:
        return text
    # A literal in a statement that also binds values: a % in a type is doubled.
    literal = pgsql.Literal(list(types)).as_string().replace("%", "%%")
    return cast(LiteralString, text.replace("%(types)s", literal))


def _claim_params(
    worker_id: str,
    limit: int,
    lease_seconds: float,
    now: datetime | None,
    since: Sequence[datetime | None] | None,
    limited_since: Mapping[str, Sequence[datetime | None]] | None = None,
) -> dict[str, object]:
    return {
        "worker": worker_id,
        "limit": limit,
        "lease": lease_seconds,
        "types": None,  # written into the statement when given (see _claim_query)
        "now": now,
        "since": _times(since),
        "limited_since": _starts_by_type(limited_since),
    }


def _times(since: Sequence[datetime | None] | None) -> str | None:
    """A PostgreSQL array literal of timestamps (NULL for None); None when all are."""
    if since is None or all(t is None for t in since):
        return None
    return "{" + ",".join("NULL" if t is None else f'"{t.isoformat()}"' for t in since) + "}"


def _starts_by_type(
    starts: Mapping[str, Sequence[datetime | None]] | None,
) -> Jsonb | None:
    """{type: [run_at as ISO text, or null, per priority]}; None when no type has one."""
    kept = {
        job_type: [None if t is None else t.isoformat() for t in times]
        for job_type, times in (starts or {}).items()
        if any(t is not None for t in times)
    }
    return Jsonb(kept) if kept else None


def write_and_claim(
    conn: Conn,
    worker_id: str,
    attempts: Sequence[Attempt],
    limit: int,
    lease_seconds: float,
    types: Sequence[str] | None = None,
    now: datetime | None = None,
    since: Sequence[datetime | None] | None = None,
    limited_since: Mapping[str, Sequence[datetime | None]] | None = None,
) -> tuple[dict[tuple[int, int], Status], list[Job]]:
    """Write a batch of outcomes and claim up to `limit` jobs: one round trip, one commit.

    Both statements travel together (pipeline mode, see `_one_trip`) in one
    transaction, so a batch's outcomes cost no commit of their own. Each
    outcome is still conditional on its lease. Either both happen or neither:
    if the transaction fails, no outcome was written and the caller keeps them.
    """
    if not attempts and limit < 1:
        return {}, []
    with errors_wrapped(), _one_trip(conn):
        conn.execute(_STEADY)
        written = None
        if attempts:
            written = conn.cursor(row_factory=tuple_row, binary=True)
            written.execute(sql.query("write_outcomes"), _outcome_params(worker_id, attempts, now))
        claimed = claim_cursor(conn, tuple_row)
        claimed.execute(
            _claim_query(types),
            _claim_params(worker_id, limit, lease_seconds, now, since, limited_since),
            binary=True,
        )
    with errors_wrapped():
        rows = written.fetchall() if written is not None else []
        statuses = {(job_id, n): _STATUS[status] for job_id, n, status in rows}
        jobs = jobs_of(claimed)
    return statuses, jobs


_STEADY = (
    b"SELECT set_config('plan_cache_mode', 'force_generic_plan', true),"
    b" set_config('enable_seqscan', 'off', true)"
)
"""The steady claim runs its generic plan, chosen, not left to PostgreSQL (and
reaches its rows through an index, see `_KEYED`).

On a busy queue PostgreSQL keeps planning the claim for each call: the generic
plan's estimate, made without the limit or the clock, is higher than a custom
one's. Planning it costs about 0.3 ms a call, 3 us a job of a batch of 100, a
tenth of the server's time per job; the generic plan walks the same index
(tests/integration/test_plans.py). The outcome statement is keyed either way.
Both settings are local, ending with the transaction: the session, pooled or
not, keeps its own, and every other statement is planned as before."""


def extend_leases(
    conn: Conn,
    worker_id: str,
    held: Iterable[tuple[int, int]],
    lease_seconds: float,
    now: datetime | None = None,
) -> list[Lease]:
    """Extend the leases on `held` (job id, claim number, `rota.attempt.Key`);
    return those still held."""
    keys = sorted(held)  # rows are locked in id order (see _outcome_params)
    if not keys:
        return []
    params = {
        "ids": [job_id for job_id, _ in keys],
        "claims": [claim for _, claim in keys],
        "worker": worker_id,
        "lease": lease_seconds,
        "now": now,
    }
    with errors_wrapped(), _keyed(conn, sql.query("extend_leases"), params, dict_row) as cur:
        rows = cur.fetchall()
    return [Lease(r["id"], r["claims"], r["cancel_requested"]) for r in rows]


def write_outcomes(
    conn: Conn, worker_id: str, attempts: Iterable[Attempt], now: datetime | None = None
) -> dict[tuple[int, int], Status]:
    """Write a batch of outcomes; only those whose lease is still held are written.

    Returns the new status of each attempt written, by its key (job id, claim number).
    """
    batch = list(attempts)
    if not batch:
        return {}
    params = _outcome_params(worker_id, batch, now)
    with errors_wrapped(), _keyed(conn, sql.query("write_outcomes"), params, dict_row) as cur:
        rows = cur.fetchall()
    return {(r["id"], r["claims"]): Status(r["status"]) for r in rows}


def _outcome_params(
    worker_id: str, batch: Sequence[Attempt], now: datetime | None
) -> dict[str, object]:
    # In id order: the statement's plan is driven from its arrays (see
    # write_outcomes in queries.sql), so it locks the rows in their order, and a
    # heartbeat (extend_leases) running beside it on another connection of the
    # same worker locks them in id order too: the two never deadlock.
    batch = sorted(batch, key=operator.attrgetter("job_id"))
    # Array literals written here, not lists for psycopg to adapt: its list
    # dumper dispatches on every element, and dumping a batch cost 5-6 us a job
    # against under 2 us this way (the server parses the same text either way).
    return {
        "ids": _numbers([a.job_id for a in batch]),
        "claims": _numbers([a.claim for a in batch]),
        "outcomes": _strings([a.outcome.value for a in batch]),
        "delays": _numbers([float(a.delay) for a in batch]),
        "errors": _strings([a.error for a in batch]),
        # NULL when no attempt of the batch returned a value: the common case costs nothing.
        "results": (
            _strings([a.result for a in batch])
            if any(a.result is not None for a in batch)
            else None
        ),
        "worker": worker_id,
        "now": now,
    }


def _numbers(values: Sequence[int | float]) -> str:
    """A PostgreSQL array literal of numbers."""
    return "{" + ",".join(map(str, values)) + "}"


def _strings(values: Sequence[str | None]) -> str:
    """A PostgreSQL array literal of strings, None as NULL."""
    return "{" + ",".join(map(_quoted, values)) + "}"


def _quoted(value: str | None) -> str:
    # Every string quoted, so that none reads as NULL or splits at a comma.
    if value is None:
        return "NULL"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def complete(conn: Conn, job: Job, now: datetime | None = None, *, result: Any = None) -> bool:
    """Mark `job` done from inside the caller's own transaction.

    For handlers that write their effects and complete the job atomically:
    returns False (and writes nothing) when the lease is no longer held, or when
    the worker has told this attempt to stop (its timeout passed, the job was
    cancelled, its lease was lost: `job.cancelled` is set). A stopped attempt
    keeps its row until its handler has really ended, so that no second handler
    starts in its place; its completion is refused all the same, and the caller
    must roll its transaction back.

    `result`, when given, is stored as the job's result (JSON, under the
    payloads' limits: InvalidInput otherwise, nothing written). Without it, the
    value the handler returns is stored once the handler has returned.
    """
    if not isinstance(job, Job):
        raise InvalidInput(f"complete takes a Job (the handler's), not {type(job).__name__}")
    encoded = None if result is None else limits.encode_result(result)
    if job.locked_by is None or job.cancelled.is_set():
        return False
    done = Attempt.of(job, Outcome.DONE, result=encoded)
    return bool(write_outcomes(conn, job.locked_by, [done], now))


def store_results(conn: Conn, worker_id: str, attempts: Sequence[Attempt]) -> None:
    """Store the return values of jobs their handlers completed themselves
    (`complete` in their own transaction, given no result): each where the
    row is done under the same worker and claim and holds no result yet."""
    with_results = [a for a in attempts if a.result is not None]
    if not with_results:
        return
    params = {
        "worker": worker_id,
        "ids": [a.job_id for a in with_results],
        "claims": [a.claim for a in with_results],
        "results": [a.result for a in with_results],
    }
    fetch_all(conn, sql.query("store_completed_results"), params)


def running_of(conn: Conn, worker_id: str) -> list[Attempt]:
    """Every row running under `worker_id`'s name, as an attempt given back
    (`Attempt.key` says which claim of its job it is)."""
    rows = fetch_all(conn, sql.query("running_of_worker"), {"worker": worker_id})
    return [
        Attempt(row["id"], row["attempts"], Outcome.RELEASED, claim=row["claims"]) for row in rows
    ]


def states(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, object]]:
    """Current status, locked_by, attempts and claims of some jobs (to explain a failed finish)."""
    rows = fetch_all(conn, sql.query("job_states"), {"ids": list(ids)})
    return {row["id"]: row for row in rows}
