"""Durable jobs: the database side of a handler's steps, sleeps, waits and children.

A handler runs from the top on every attempt; nothing is replayed. What a run
did before is read back: a completed step answers from ``rota.job_step``, a
sleep or wait that ended says how it ended (``rota.job_wait``), a spawn finds
the child it made (``rota.job_child``). So the code may change between runs,
and a loop names its steps (``f"charge-{i}"``).

`Run` is one attempt's view, made by the worker for each job it runs (see
`rota.handlers.Context`). It borrows a connection from the worker's
`RunConnections` and gives it back when the attempt ends, so that a step's
statement is prepared once per connection rather than once per job, and a
job's first step does not wait for a new connection (a handler that asks for
`Run.conn` gets a connection of the run's own instead). Its writes are
conditional on the job's lease, like outcomes: a worker that lost its lease
stores nothing (`LeaseLost`). A step runs in a transaction of the run's
connection (`Run.conn`): what the step writes through it commits with the
step's result, once, or not at all.

A sleep, wait or gather whose condition is not met suspends the job in one
statement (`rota.suspend`, migration 0025): status waiting, the attempt not
counted, the lease let go. Then `Suspended` ends the attempt and the worker
frees the slot. A job somebody asked to cancel does not wait (`CancelRequested`),
nor does an attempt that was stopped (`Cancelled`). This module never decides
an attempt's outcome itself.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from rota import limits, sql
from rota.db import (
    APPLICATION_NAME,
    Conn,
    ConnOrDsn,
    connect,
    connection,
    errors_wrapped,
    fetch_all,
    settle,
)
from rota.errors import (
    Cancelled,
    CancelRequested,
    ChildFailed,
    InvalidInput,
    LeaseLost,
    Permanent,
    Suspended,
    TimedOut,
)
from rota.jobs import NOT_ENDED, Job, NewJob, Status
from rota.reading import make_tolerant
from rota.settings import ConnectionSettings, QueueSettings

_DEFAULTS = QueueSettings()

_Sent = TypeVar("_Sent")
"""What a run's statement answers: its rows."""

_RESULT = "the handler's return value"
"""How `limits.encode_result` names the value it refuses (a step's result, here)."""

CHILD_OPTIONS = frozenset({"run_at", "delay", "max_attempts", "priority", "timeout", "group"})
"""What `spawn` passes on to its child, as `rota.enqueue` takes it."""


def emit(conn_or_dsn: ConnOrDsn, key: str, payload: Any = None) -> int:
    """Emit the event `key`: every job waiting on it is ready again, and a later
    `wait_for(key)` returns `payload` at once. The first emit of a key wins; a
    later one changes nothing. Returns the number of jobs woken. Inside the
    caller's transaction when given a connection (nothing committed for it)."""
    limits.name(key, "event key")
    # No payload is SQL's NULL, as `rota.emit(key)` in SQL stores it: a wait
    # returns None, not the {} a job's payload of None becomes.
    encoded = None if payload is None else limits.encode_payload(payload)
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("emit"), {"key": key, "payload": encoded})
    return int(rows[0]["woken"])


def wake_rechecked(conn_or_dsn: ConnOrDsn, limit: int = 1000) -> list[int]:
    """Wake the waiters of up to `limit` keys emitted in a REPEATABLE READ or
    SERIALIZABLE transaction, whose snapshot could not see a wait committed
    just before the emit (migration 0042); the ids made ready. The reaper calls
    it on every pass."""
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("wake_rechecked"), {"limit": limit})
    return [row["id"] for row in rows]


def wake_due(conn_or_dsn: ConnOrDsn, now: datetime | None = None, limit: int = 1000) -> list[int]:
    """Make the waiting jobs whose time has come ready again (one capped batch):
    sleeps that ended, waits that timed out. The reaper calls it on every pass."""
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("wake_due"), {"now": now, "limit": limit})
    return [row["id"] for row in rows]


@dataclasses.dataclass(frozen=True)
class Trail:
    """What a durable job did so far: for `rota jobs show` and the console's job page."""

    steps: list[dict[str, Any]]
    """name, attempt, started_at, finished_at, result_bytes, result (the first 200 characters)."""
    waits: list[dict[str, Any]]
    """name, kind, event_key, children (how many), until, started_at, ended_at, ended_by."""
    children: list[dict[str, Any]]
    """name, id, status, type (status and type None once the child is gone)."""
    parent_id: int | None = None
    """The job that spawned this one, if one did."""
    left_out: dict[str, int] = dataclasses.field(default_factory=dict)
    """Of a trail cut short (`trail`'s `shown`): how many steps and waits before
    the ones listed, and children after them, are not listed."""

    def __bool__(self) -> bool:
        return bool(self.steps or self.waits or self.children or self.parent_id)


def trail(conn_or_dsn: ConnOrDsn, job_id: int, shown: int | None = None) -> Trail:
    """The steps, waits and children of a job (empty lists for a job that has none):
    every one, or at most `shown` of each (the last steps and waits, the first
    children)."""
    params = {"job": job_id, "limit": shown}
    with connection(conn_or_dsn) as conn:
        parent = fetch_all(conn, sql.query("job_parent"), params)
        listed = {
            part: fetch_all(conn, sql.query(f"job_{part}"), params)
            for part in ("steps", "waits", "children")
        }
    left_out = {part: left_out_of(rows) for part, rows in listed.items()}
    return Trail(
        **listed,
        parent_id=parent[0]["parent_id"] if parent else None,
        left_out=left_out if shown is not None else {},
    )


def left_out_of(rows: list[dict[str, Any]]) -> int:
    """Of rows read with a `total` column (`count(*) OVER ()` before a LIMIT):
    how many the limit left out. The column is taken off the rows."""
    total = rows[0]["total"] if rows else 0
    for row in rows:
        del row["total"]
    return int(total) - len(rows)


def _configured(conn: Conn) -> None:
    make_tolerant(conn.adapters)
    settle(conn)


class RunConnections:
    """The connections a worker's runs borrow, one per run at a time, kept
    between runs (at most `size` of them, each closed after ten idle minutes;
    none opened before the first run asks). A borrowed connection never
    reaches a handler: a run whose handler asks for `Run.conn` gives it back
    and goes on with a connection of its own (`own`), closed at its end, so
    that what the handler set on it stays with it. Once closed (the worker
    stopped), a run that is still going gets a connection of its own too.
    They prepare statements as the worker's `connection` settings say (not
    with a pooler in transaction mode); its timeouts are not theirs, since a
    handler's own statements run on them."""

    def __init__(self, dsn: str, size: int, connection: ConnectionSettings | None = None) -> None:
        self.dsn = dsn
        self.size = max(1, size)
        self._options = (connection or ConnectionSettings()).preparing()
        self._pool: ConnectionPool[Conn] | None = None
        self._closed = False
        self._lock = threading.Lock()

    def own(self) -> Conn:
        """A connection for one run alone, outside the pool: its run closes it."""
        return connect(self.dsn, **self._options)

    def get(self) -> Conn:
        with self._lock:
            if self._closed:
                return self.own()
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.dsn,
                    min_size=0,
                    max_size=self.size,
                    kwargs={
                        "autocommit": True,
                        "row_factory": dict_row,
                        "application_name": APPLICATION_NAME,
                        **self._options,
                    },
                    configure=_configured,
                    name="rota-runs",
                    open=True,
                )
            pool = self._pool
        with errors_wrapped():
            return pool.getconn()

    def put(self, conn: Conn) -> None:
        """Give back a connection `get` lent; one that cannot be rolled back is
        closed (the pool opens another in its place)."""
        keep = not conn.closed
        if keep:
            try:
                if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                    conn.rollback()
            except psycopg.Error:
                keep = False
        with self._lock:
            pool = self._pool
        if not keep or pool is None:
            conn.close()
        if pool is not None:
            pool.putconn(conn)

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.close()


class Run:
    """One attempt of one job, as its handler's durable calls see it."""

    def __init__(
        self,
        dsn: str,
        worker_id: str,
        job: Job,
        connections: RunConnections | None = None,
        now: datetime | None = None,
    ) -> None:
        self.dsn = dsn
        self.worker_id = worker_id
        self.job = job
        self.now = now
        """The database's clock unless given (tests inject time)."""
        self._connections = connections
        self._conn: Conn | None = None
        self._raw: psycopg.RawCursor[tuple[Any, ...]] | None = None
        self._lent = False
        """The handler asked for `conn`: until then the run's connection is one it
        borrowed from `connections`, from then on one of its own."""
        self._ended = False
        """The attempt is over (`close`): a durable call still on its way (an async
        handler's, in a thread the handler left) borrows no connection."""
        self._stored: dict[str, Any] | None = None
        self._names: dict[str, set[str]] = {"step": set(), "spawn": set()}
        """The step and spawn names this run has used, each kind apart."""
        self._counts: collections.Counter[str] = collections.Counter()
        """Calls made so far, by kind (sleep, spawn, gather; event:<key>)."""
        self._tally = threading.Lock()
        """Held while a call is numbered or named: never held across a statement,
        so that an async handler's event loop numbering a call never waits on
        another call's round trip."""
        self._step: str | None = None
        """The step whose function runs now, if one does."""
        self._suspended: str | None = None
        """The wait this run suspended on. The job is waiting from then on and
        the attempt is over, whatever its handler does: every durable call
        after it raises `Suspended` again (a handler that caught it runs no step
        and makes no child or wait)."""
        self._lock = threading.RLock()
        """Held by each durable call while it uses the run's state and connection:
        calls made at once (threads, or an async handler's `asyncio.gather`) take
        turns on the run's one connection."""

    @property
    def conn(self) -> Conn:
        """The run's connection (not autocommit). Inside a step, what is written
        through it commits with the step's result; elsewhere commit it yourself."""
        with self._lock:
            if not self._lent:
                # The handler may leave anything on it: the run gives back the
                # connection it borrowed and goes on with one of its own. Until
                # now its statements each committed by themselves; from here on
                # they join the handler's transaction.
                self._give_back()
                self._lent = True
                with errors_wrapped():
                    self._own().autocommit = False
            return self._own()

    def _own(self) -> Conn:
        with self._lock:
            if self._ended:
                raise Cancelled(f"job {self.job.id}: its run has ended")
            if self._conn is None:
                if self._connections is None:
                    self._conn = connect(self.dsn)
                elif self._lent:
                    self._conn = self._connections.own()
                else:
                    self._conn = self._connections.get()
            return self._conn

    def _give_back(self) -> None:
        """Let go of the run's connection: a borrowed one goes back to the worker,
        one of its own is closed."""
        with self._lock:
            conn, self._conn, raw, self._raw = self._conn, None, self._raw, None
            if raw is not None:
                raw.close()
            if conn is None:
                return
            if self._connections is not None and not self._lent:
                self._connections.put(conn)
            else:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._ended = True
        self._give_back()

    # Steps

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` once per job and `name`; its stored result after."""
        found, value = self._begin_step(name, fn)
        if found:
            return value
        started = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
            return self._end_step(name, value, started)
        except BaseException:
            self._abandon_step()
            raise

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`step` for async handlers: `fn` may be a coroutine function."""
        found, value = await asyncio.to_thread(self._begin_step, name, fn)
        if found:
            return value
        started = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            return await asyncio.to_thread(self._end_step, name, value, started)
        except BaseException:
            await asyncio.to_thread(self._abandon_step)
            raise

    def _begin_step(self, name: str, fn: object) -> tuple[bool, Any]:
        with self._lock:
            self.raise_if_suspended()
            self._name(name, "step")
            if not callable(fn):
                # Most often the function called where it is passed: the call
                # has run already, and a retry would run it (and all before it)
                # again.
                raise Permanent(
                    f"step {name!r} takes a function to call, not a {type(fn).__name__}"
                    " (pass the function and its arguments, not what it returned)"
                )
            if self._step is not None:
                raise Permanent(
                    f"step {name!r} began while another step ran: steps neither nest"
                    " nor run at once"
                )
            if self._stored is None:
                self._stored = dict(self._commit(self._stored_steps))
            if name in self._stored:
                return True, self._stored[name]
            self.job.raise_if_cancelled()  # a stopped attempt starts no new step
            self._step = name
            return False, None

    def _end_step(self, name: str, value: Any, started: float) -> Any:
        with self._lock:
            return self._store_step(name, value, started)

    def _store_step(self, name: str, value: Any, started: float) -> Any:
        try:
            encoded = limits.encode_result(value)
        except InvalidInput as exc:  # the step's code: no retry can mend it
            why = str(exc)
            if why.startswith(_RESULT):
                why = why[len(_RESULT) :]
                raise Permanent(f"step {name!r} returned a value that{why}") from None
            raise Permanent(f"step {name!r} returned a value rota cannot store: {why}") from None
        self._step = None
        # The step's writes (if it made any through `conn`) and its result commit
        # together; a step that wrote nothing stores its result in one round trip.
        save = sql.query("save_step")
        args = (
            self.job.id,
            name,
            encoded,
            self.job.claims,
            time.perf_counter() - started,
            self.worker_id,
            self.now,
        )
        stored_rows = self._commit(
            lambda conn: self._cursor(conn).execute(save, args).fetchall(), none_undoes=True
        )
        if not stored_rows:
            raise LeaseLost(f"job {self.job.id}: lease lost before step {name!r} was stored")
        # The value as stored, read back by the statement that stored it: what
        # a later run reads (jsonb orders keys and reads 1e20 as a whole number).
        [(stored,)] = stored_rows
        assert self._stored is not None
        self._stored[name] = stored
        return stored

    def _stored_steps(self, conn: Conn) -> list[tuple[Any, ...]]:
        """(name, result) of every step of the job stored before this run."""
        return self._cursor(conn).execute(sql.query("steps_of_job"), (self.job.id,)).fetchall()

    def _cursor(self, conn: Conn) -> psycopg.RawCursor[tuple[Any, ...]]:
        """The cursor of the statements a run sends for each job and step: their
        parameters positional, so psycopg has no named parameters to convert."""
        if self._raw is None:
            self._raw = psycopg.RawCursor(conn, row_factory=tuple_row)
        return self._raw

    def _abandon_step(self) -> None:
        with self._lock:
            self._step = None
            conn = self._conn
            if conn is not None and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                with errors_wrapped():
                    conn.rollback()

    # Waits and children. Each call is checked and numbered when the handler
    # makes it (`prepare`), then done: an async handler's calls are numbered on
    # its event loop, in the order it made them, and done in threads that may
    # get there in another order. A default name is the call's place in the
    # run, so a later run finds the wait or child of the same call.

    def prepare(self, method: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        """The durable call `method` (sleep, wait_for, spawn, gather) checked and
        named now; the function returned does it."""
        self.raise_if_suspended()
        preparers: dict[str, Callable[..., Callable[[], Any]]] = {
            "sleep": self._sleeping,
            "wait_for": self._waiting_for,
            "spawn": self._spawning,
            "gather": self._gathering,
        }
        return preparers[method](*args, **kwargs)

    def sleep(self, seconds: float) -> None:
        """Leave the worker for `seconds` (the job waits); return once they have passed."""
        self.prepare("sleep", seconds)()

    def wait_for(self, key: str, timeout: float | None = None) -> Any:
        """The payload of the first emit of `key`, waiting (job waiting) until it comes;
        `TimedOut` once `timeout` seconds have passed since the job first waited on it."""
        return self.prepare("wait_for", key, timeout)()

    def spawn(
        self, job_type: str, payload: Any = None, *, name: str | None = None, **options: Any
    ) -> int:
        """Enqueue a child once per this job and `name` (default: the n-th spawn of
        the run, or `s/n` for the n-th inside step `s`); its id, the same on
        every run."""
        made: int = self.prepare("spawn", job_type, payload, name=name, **options)()
        return made

    def gather(self, ids: Sequence[int]) -> list[Any]:
        """The results of children `ids`, in order, once every one has ended;
        `ChildFailed` for the first that did not end done."""
        gathered: list[Any] = self.prepare("gather", ids)()
        return gathered

    def _sleeping(self, seconds: float) -> Callable[[], Any]:
        seconds = limits.delay_seconds(seconds, "sleep")
        name = f"sleep:{self._next('sleep')}"

        def sleep() -> None:
            self._wait(name, "sleep", seconds=seconds)

        return sleep

    def _waiting_for(self, key: str, timeout: float | None) -> Callable[[], Any]:
        limits.name(key, "event key")
        if timeout is not None:
            timeout = limits.delay_seconds(timeout, "wait timeout")
        # Each wait on a key is a wait of its own, with its own timeout: one that
        # timed out stays ended, and a second wait on the key waits anew.
        count = self._next(f"event:{key}")
        name = f"event:{key}" if count == 1 else f"event#{count}:{key}"
        return lambda: self._wait_for(name, key, timeout)

    def _wait_for(self, name: str, key: str, timeout: float | None) -> Any:
        ended = self._wait(name, "event", key=key, seconds=timeout)
        if ended != "event":
            # Its time came first, on this run as on any later one (an emit
            # since then wakes other waits).
            raise TimedOut(f"no event {key!r} within {timeout:g}s" if timeout is not None else None)
        # Read from the wait, not the event: the archive deletes events after
        # their retention, and the key may be emitted anew after that.
        [got] = self._read(sql.query("wait_payload"), {"job": self.job.id, "name": name})
        if not got["kept"]:
            raise Permanent(
                f"the payload of event {key!r} is gone: {name} ended before migration 0044"
                " and the event was deleted (or emitted anew) before it ran"
            )
        return got["payload"]

    def _spawning(
        self, job_type: str, payload: Any = None, *, name: str | None = None, **options: Any
    ) -> Callable[[], int]:
        self.job.raise_if_cancelled()  # a stopped attempt makes no new child
        default = self._default_spawn_name()
        name = limits.name(default if name is None else name, "spawn name")
        params = _child_params(self.job.id, name, job_type, payload, options) | self._holder()
        # Twice in one run, a name would answer the second spawn with the first
        # one's child (of another type, maybe): a bug, as a step's name used twice.
        self._name(name, "spawn")
        return lambda: self._spawn(name, params)

    def _default_spawn_name(self) -> str:
        """The name of this spawn if it is given none: the n-th spawn of the run is
        named n; inside step `s`, the n-th spawn of the step is named `s/n`,
        apart from the run's count: a later run whose step answers from
        storage makes no spawn there, and the spawns after it keep their
        names. Counted for every spawn, named or not."""
        step = self._step
        if step is None:
            return str(self._next("spawn"))
        return f"{step}/{self._next(f'spawn in step:{step}')}"

    def _spawn(self, name: str, params: dict[str, Any]) -> int:
        self.raise_if_suspended()  # an async spawn called before the suspension
        self.job.raise_if_cancelled()
        [made] = self._write(sql.query("spawn_child"), params)
        if not made["held"]:
            raise LeaseLost(f"job {self.job.id}: lease lost before it could spawn {name!r}")
        if not made["free"]:  # asked while it ran: its worker has not heard yet
            raise CancelRequested(f"job {self.job.id}: cancel requested; no child {name!r}")
        if made["id"] is not None:
            return int(made["id"])
        rows = self._write(sql.query("child_of_name"), {"parent": self.job.id, "name": name})
        return int(rows[0]["id"])

    def _gathering(self, ids: Sequence[int]) -> Callable[[], list[Any]]:
        wanted = limits.job_ids(ids, "child ids")
        if not wanted:
            return lambda: []
        name = f"gather:{self._next('gather')}"
        return lambda: self._gather(name, wanted)

    def _gather(self, name: str, wanted: list[int]) -> list[Any]:
        while True:
            self._wait(name, "children", children=wanted)
            rows = self._read(
                sql.query("children_outcomes"), {"ids": wanted, "parent": self.job.id}
            )
            found = {row["id"]: row for row in rows}
            if not any(row["status"] in NOT_ENDED for row in found.values()):
                break
            # A child brought back (`rota dead retry`) after this gather ended:
            # the gather opens again and waits for it, as for the first time.
            reopen = {"job": self.job.id, "name": name, **self._holder()}
            if not self._write(sql.query("reopen_gather"), reopen):
                raise LeaseLost(f"job {self.job.id}: lease lost before it could wait on {name}")
        results = []
        for child in wanted:
            row = found.get(child)
            if row is None:
                raise Permanent(f"job {child} is not a child of job {self.job.id}")
            if row["status"] != Status.DONE:
                raise ChildFailed(child, row["status"], row["last_error"])
            results.append(None if row["result"] is None else json.loads(row["result"]))
        return results

    def _wait(
        self,
        name: str,
        kind: str,
        key: str | None = None,
        children: list[int] | None = None,
        seconds: float | None = None,
    ) -> str:
        """Suspend on the wait `name` unless it has ended; how it ended."""
        with self._lock:
            self.raise_if_suspended()  # an async wait called before the suspension
            if self._step is not None:
                raise Permanent(f"{name!r} inside a step: a step cannot wait")
        # A stopped attempt does not wait: it ends as its stop says.
        self.job.raise_if_cancelled()
        if children is not None:
            self._check_children(children)
        params = {
            "job": self.job.id,
            **self._holder(),
            "name": name,
            "kind": kind,
            "key": key,
            "children": children,
            "seconds": seconds,
            "now": self.now,
        }
        state = str(self._write(sql.query("suspend"), params)[0]["state"])
        if state == "lost":
            raise LeaseLost(f"job {self.job.id}: lease lost before it could wait on {name}")
        if state == "cancelled":  # asked while it ran: its worker has not heard yet
            raise CancelRequested(f"job {self.job.id}: cancel requested; no wait on {name}")
        if state == "waiting":
            self._suspended = name
            raise Suspended(self.job.id, name)
        return state

    def raise_if_suspended(self) -> None:
        """`Suspended` again once the run has suspended: the job waits, and this
        attempt is over however its handler took the first one."""
        if self._suspended is not None:
            raise Suspended(self.job.id, self._suspended)

    def _holder(self) -> dict[str, Any]:
        """The lease this run writes under: a statement given it writes nothing
        unless the job still runs under this claim, held by this worker."""
        return {"claim": self.job.claims, "worker": self.worker_id}

    def _check_children(self, children: list[int]) -> None:
        rows = self._read(sql.query("children_known"), {"parent": self.job.id, "ids": children})
        known = {row["child_id"] for row in rows}
        strangers = [child for child in children if child not in known]
        if strangers:
            raise Permanent(f"jobs {strangers} are not children of job {self.job.id}")

    # Plumbing

    def _name(self, name: str, what: str) -> None:
        limits.name(name, f"{what} name")
        with self._tally:
            if name in self._names[what]:
                raise Permanent(f"{what} name {name!r} used twice in one run of job {self.job.id}")
            self._names[what].add(name)

    def _next(self, what: str) -> int:
        with self._tally:
            self._counts[what] += 1
            return self._counts[what]

    def _read(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run `query`; commit unless a step's transaction is open (no snapshot kept)."""
        return self._write(query, params)

    def _write(
        self, query: str, params: dict[str, Any], *, none_undoes: bool = False
    ) -> list[dict[str, Any]]:
        """Run `query` and commit (see `_commit`)."""
        return self._commit(lambda conn: fetch_all(conn, query, params), none_undoes=none_undoes)

    def _commit(self, send: Callable[[Conn], _Sent], *, none_undoes: bool = False) -> _Sent:
        """Send a statement (`send`) and commit, with what the connection's open
        transaction holds; inside a step, in the step's transaction, committed with
        it. With `none_undoes`, an empty answer (no rows, or none stored) rolls
        that transaction back instead (a step's lease was lost). With no
        transaction open, the statement commits by itself: one round trip, where
        BEGIN, the statement and COMMIT take three (and so does every statement of
        a run whose handler never asked for `conn`)."""
        with self._lock, errors_wrapped():
            conn = self._own()
            if self._step is not None or conn.autocommit:
                return send(conn)
            if conn.info.transaction_status == pq.TransactionStatus.IDLE:
                conn.autocommit = True
                try:
                    return send(conn)
                finally:
                    conn.autocommit = False
            sent = send(conn)
            if sent or not none_undoes:
                conn.commit()
            else:
                conn.rollback()
            return sent


def _child_params(
    parent: int, name: str, job_type: str, payload: Any, options: dict[str, Any]
) -> dict[str, Any]:
    unknown = sorted(set(options) - CHILD_OPTIONS)
    if unknown:
        # A keyword may be any string (`**{"a\nb": 1}`): shown as a repr unless
        # it is a plain identifier, so that the reason stays one line.
        shown = ", ".join(u if u.isidentifier() else repr(u) for u in unknown)
        raise Permanent(
            f"spawn takes {', '.join(sorted(CHILD_OPTIONS))} (not {shown}):"
            " a child is unique by its parent and name, never by a key"
        )
    child = NewJob(job_type, payload, **options)
    encoded = limits.new_job(child, _DEFAULTS.max_payload_bytes)
    return {
        "parent": parent,
        "name": name,
        "type": child.type,
        "payload": Jsonb(payload, dumps=lambda _: encoded),
        "run_at": child.run_at,
        "delay": None if child.delay is None else float(child.delay),
        "max_attempts": child.max_attempts,
        "priority": 0 if child.priority is None else child.priority,
        "timeout": child.timeout,
        "group": child.group,
        "default_max_attempts": _DEFAULTS.default_max_attempts,
        "now": None,
    }
