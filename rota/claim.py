"""Claiming jobs, holding their leases, and recording how they ended.

The lease is the whole safety story: a worker holds a job while the row is
running, locked_by the worker, at the attempt it claimed. Heartbeats extend the
lease; every write of an outcome is conditional on still holding it, so a worker
whose lease was taken away (reaped, then claimed by another) changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString, cast

from psycopg import Cursor, pq
from psycopg import sql as pgsql
from psycopg.rows import dict_row, tuple_row

from rota import sql
from rota.db import Conn, errors_wrapped, fetch_all
from rota.decoding import claim_cursor
from rota.jobs import Job, Outcome, Status, StopSignal


@dataclasses.dataclass(slots=True)
class Attempt:
    """How one attempt of a job ended, as its worker saw it: what to write.

    Never changed once built (`dataclasses.replace` makes another), yet not
    frozen: a frozen dataclass sets each field through object.__setattr__, and
    one Attempt is built per job (2.3 us against 0.6 here)."""

    job_id: int
    attempts: int
    """The attempt number the worker claimed (the lease is tied to it)."""
    outcome: Outcome
    """DONE, RETRY, FAILED, RELEASED or CANCELLED: what the handler run decided."""
    delay: float = 0.0
    """Seconds before a retried or released job may run again."""
    error: str | None = None
    type: str = ""
    """The job's type, for logs and metrics (not written)."""
    duration_seconds: float = 0.0
    """How long the handler ran (not written)."""
    owner: object = dataclasses.field(default=None, compare=False, repr=False)
    """The worker's own record of the attempt this outcome ends (not written). The
    worker tells attempts apart by this record, never by (job id, attempt): a job
    given back and claimed again in the same statement has the same key twice."""
    result: str | None = None
    """The handler's return value as JSON text (None when it returned None)."""

    @property
    def key(self) -> tuple[int, int]:
        """(job id, attempt): one attempt of one job, never confused with another."""
        return (self.job_id, self.attempts)


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """A lease the heartbeat extended."""

    job_id: int
    attempts: int
    cancel_requested: bool
    """Somebody asked to cancel the job: its handler should stop."""


PRIORITIES = 10
"""Priorities 0 (first) to 9, as DESIGN fixes them."""


class Floor:
    """Where a worker's claims start their walk of the claim index, per priority.

    The claim walks `job_claim_idx` in (priority, run_at, id) order. Every job
    claimed leaves an index entry behind its ready version; once no snapshot can
    see that version, the first scan to meet it marks it dead and the next ones
    skip it. A transaction held open anywhere in the database (a report, a
    `pg_dump`, a session left idle in transaction) keeps every such version
    visible, and each claim walks all the entries of the jobs claimed since it
    began: a claim of 0.7 ms took 58 ms after three minutes of 1,000 jobs/s.

    So each claim starts where the worker's last one ended at that priority,
    less `MARGIN` for an enqueue that committed after jobs queued behind it
    were claimed. A job can still become ready behind that point: a paused
    type resumed, a claim rolled back, a run_at given in the past, a job
    skipped while another transaction held its row. `probe` finds the first
    ready job of each priority (the heartbeat thread runs it every
    `PROBE_SECONDS`) and moves the start back to it, so such a job waits at
    most that long behind a busy queue; with the queue idle it waits for the
    next claim, as before.

    The claims of the two lanes and the probe of the heartbeat thread share
    one Floor: a claim raises a priority's start only if it was sent after the
    probe last lowered it (else it may have walked past the job found).
    """

    MARGIN = timedelta(seconds=0.1)
    PROBE_SECONDS = 1.0

    def __init__(self, types: Sequence[str] | None = None) -> None:
        self.types = None if types is None else tuple(types)
        self._since: list[datetime | None] = [None] * PRIORITIES
        self._lowered: list[int] = [0] * PRIORITIES
        self._generation = 0
        self._limited: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def bounds(self) -> tuple[list[datetime | None], int]:
        """Each priority's start, and the generation a claim sent with it carries."""
        with self._lock:
            return list(self._since), self._generation

    def claimed(self, jobs: Sequence[Job], generation: int) -> None:
        """A claim sent at `generation` took `jobs`, in the order they start (as `claim`
        returns them): their priorities start behind the last of them from now on.
        Jobs of limited types are picked apart from the walk (rota.pick_limited)
        and move nothing."""
        with self._lock:
            limited = self._limited
            # In start order, the last job of a priority has its latest run_at.
            last = {job.priority: job.run_at for job in jobs if job.type not in limited}
            for p, run_at in last.items():
                if generation < self._lowered[p]:
                    continue
                start = run_at - self.MARGIN
                since = self._since[p]
                if since is None or start > since:
                    self._since[p] = start

    def probe(self, conn: Conn, now: datetime | None = None) -> list[int]:
        """Move back each priority's start to its first ready job; the priorities moved."""
        with self._lock:
            if all(since is None for since in self._since):
                return []  # every claim walks from the first: nothing to move
        with errors_wrapped(), conn.cursor(row_factory=tuple_row) as cur:
            limited = frozenset(row[0] for row in cur.execute(sql.query("limited_types")))
            cur.execute(_floor_statement(self.types), {"types": None, "now": now})
            firsts = cur.fetchall()
        moved = []
        with self._lock:
            self._limited = limited
            for priority, run_at in firsts:
                since = self._since[priority]
                if run_at is not None and since is not None and run_at < since:
                    self._generation += 1
                    self._lowered[priority] = self._generation
                    self._since[priority] = run_at
                    moved.append(priority)
        return moved


@functools.lru_cache(maxsize=64)
def _floor_statement(types: tuple[str, ...] | None) -> LiteralString:
    return _with_types(sql.query("claim_floor"), types)


def claim(
    conn: Conn,
    worker_id: str,
    limit: int,
    lease_seconds: float,
    types: Sequence[str] | None = None,
    now: datetime | None = None,
    since: Sequence[datetime | None] | None = None,
) -> list[Job]:
    """Claim up to `limit` ready jobs (of `types`, or any) for `worker_id`.

    `since`, one run_at per priority (None: from the first), is where each
    priority's walk starts (see Floor).
    """
    if limit < 1:
        return []
    params = _claim_params(worker_id, limit, lease_seconds, now, since)
    query = _claim_query(types)
    with errors_wrapped(), _keyed(conn, query, params, tuple_row, binary=True, claim=True) as cur:
        return _jobs(cur)


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
    return _with_types(sql.query("claim_jobs"), types)


def _with_types(text: LiteralString, types: tuple[str, ...] | None) -> LiteralString:
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
) -> dict[str, object]:
    return {
        "worker": worker_id,
        "limit": limit,
        "lease": lease_seconds,
        "types": None,  # written into the statement when given (see _claim_query)
        "now": now,
        "since": _times(since),
    }


def _times(since: Sequence[datetime | None] | None) -> str | None:
    """A PostgreSQL array literal of timestamps (NULL for None); None when all are."""
    if since is None or all(t is None for t in since):
        return None
    return "{" + ",".join("NULL" if t is None else f'"{t.isoformat()}"' for t in since) + "}"


_JOB_FIELDS = [f.name for f in dataclasses.fields(Job) if f.init and f.name != "cancelled"]
_STATUS = {status.value: status for status in Status}


def _job_builder() -> Callable[[tuple[Any, ...]], Job]:
    """`Job(*row)` for a row of every column in field order, for a third of the cost.

    Job is frozen: its __init__ sets each field through a call of
    object.__setattr__ (5.4 us a job here). The function made here puts each
    value straight into its slot, one statement a field, the way dataclasses
    writes an __init__: 2.7 us (a loop over the slots took 4). The fields and
    their values are the same (tests/integration/test_leases.py compares a
    claimed job with its row); a row of another length raises ValueError.
    """
    values = [f"v{i}" for i in range(len(_JOB_FIELDS))]
    lines = ["def job(row):", "    made = new(Job)", f"    {', '.join(values)}, = row"]
    for name, value in zip(_JOB_FIELDS, values, strict=True):
        lines.append(
            f"    set_{name}(made, {'STATUS[' + value + ']' if name == 'status' else value})"
        )
    lines += ["    set_cancelled(made, StopSignal())", "    return made"]
    scope: dict[str, Any] = {"new": object.__new__, "Job": Job, "STATUS": _STATUS}
    scope["StopSignal"] = StopSignal
    scope.update({f"set_{f.name}": getattr(Job, f.name).__set__ for f in dataclasses.fields(Job)})
    exec("\n".join(lines), scope)
    built: Callable[[tuple[Any, ...]], Job] = scope["job"]
    return built


_job = _job_builder()


def _jobs(cur: Cursor[tuple[Any, ...]]) -> list[Job]:
    """Claimed rows as jobs, in the order they should start.

    The claim returns a Job's columns in its field order, so each job is
    built positionally; any other shape is built by name.
    """
    # The hot statements return their rows in binary: the server sends each value
    # as stored instead of formatting it as text (timestamps above all), and
    # psycopg reads it without parsing.
    rows = cur.fetchall()  # first: in pipeline mode the description comes with the rows
    names = [column.name for column in cur.description or ()]
    if names == _JOB_FIELDS:
        jobs = [_job(row) for row in rows]
    else:
        jobs = [Job.from_row(dict(zip(names, row, strict=True))) for row in rows]
    jobs.sort(key=_start_order)
    return jobs


def _start_order(job: Job) -> tuple[int, datetime, int]:
    return (job.priority, job.run_at, job.id)


def write_and_claim(
    conn: Conn,
    worker_id: str,
    attempts: Sequence[Attempt],
    limit: int,
    lease_seconds: float,
    types: Sequence[str] | None = None,
    now: datetime | None = None,
    since: Sequence[datetime | None] | None = None,
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
            _claim_params(worker_id, limit, lease_seconds, now, since),
            binary=True,
        )
    with errors_wrapped():
        rows = written.fetchall() if written is not None else []
        statuses = {(job_id, n): _STATUS[status] for job_id, n, status in rows}
        jobs = _jobs(claimed)
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
    """Extend the leases on `held` (job id, attempt); return those still held."""
    keys = sorted(held)  # rows are locked in id order (see _outcome_params)
    if not keys:
        return []
    params = {
        "ids": [job_id for job_id, _ in keys],
        "attempts": [attempts for _, attempts in keys],
        "worker": worker_id,
        "lease": lease_seconds,
        "now": now,
    }
    with errors_wrapped(), _keyed(conn, sql.query("extend_leases"), params, dict_row) as cur:
        rows = cur.fetchall()
    return [Lease(r["id"], r["attempts"], r["cancel_requested"]) for r in rows]


def write_outcomes(
    conn: Conn, worker_id: str, attempts: Iterable[Attempt], now: datetime | None = None
) -> dict[tuple[int, int], Status]:
    """Write a batch of outcomes; only those whose lease is still held are written.

    Returns the new status of each attempt written, by (job id, attempt).
    """
    batch = list(attempts)
    if not batch:
        return {}
    params = _outcome_params(worker_id, batch, now)
    with errors_wrapped(), _keyed(conn, sql.query("write_outcomes"), params, dict_row) as cur:
        rows = cur.fetchall()
    return {(r["id"], r["attempts"]): Status(r["status"]) for r in rows}


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
        "attempts": _numbers([a.attempts for a in batch]),
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


def complete(conn: Conn, job: Job, now: datetime | None = None) -> bool:
    """Mark `job` done from inside the caller's own transaction.

    For handlers that write their effects and complete the job atomically:
    returns False (and writes nothing) when the lease is no longer held, in which
    case the caller must roll its transaction back.
    """
    if job.locked_by is None:
        return False
    written = write_outcomes(
        conn, job.locked_by, [Attempt(job.id, job.attempts, Outcome.DONE)], now
    )
    return bool(written)


def running_of(conn: Conn, worker_id: str) -> list[tuple[int, int]]:
    """(job id, attempt) of every row running under `worker_id`'s name."""
    rows = fetch_all(conn, sql.query("running_of_worker"), {"worker": worker_id})
    return [(row["id"], row["attempts"]) for row in rows]


def states(conn: Conn, ids: Sequence[int]) -> dict[int, dict[str, object]]:
    """Current status, locked_by and attempts of some jobs (to explain a failed finish)."""
    rows = fetch_all(conn, sql.query("job_states"), {"ids": list(ids)})
    return {row["id"]: row for row in rows}
