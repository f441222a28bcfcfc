"""How a claim's rows become jobs: fast for every row, and never crashed by one.

A claimed job's row is built into a `Job` positionally (`jobs_of`), with the
two loaders that cost most made cheaper (below). A row that cannot be read at
all (a payload nested deeper than Python's recursion limit, a timestamp past
year 9999, text the client cannot decode: values written around the
database's checks) must not take its claim, its neighbours or the worker down
with it: the claim's rows are then read one at a time, and each row that still
fails becomes a job whose payload is `Unreadable` (the reason, the column), so
that its worker writes it dead at once and the rest run as ever.

The loaders:

A claimed job's row carries a jsonb payload and four or five timestamps. With
psycopg's defaults, the payload goes through `json.loads` on bytes (which first
guesses the encoding: 3.4 us for `{"i": 1}`) and every timestamp is moved into
the session's time zone by `astimezone` (0.9 us for a `ZoneInfo` such as
Etc/UTC, 0.3 for `timezone.utc`): about a quarter of what reading a claim costs
its I/O thread. The claim's cursor reads the payload from the text PostgreSQL
sends (always one JSON value, nothing around it) and the timestamps in UTC.
Both give the same values (the same instants: `2026-01-01 10:00+01` and
`09:00+00` are equal datetimes); the timestamps' `tzinfo` is `timezone.utc`
whatever the server's TimeZone.

A connection whose jsonb or timestamptz loader is not psycopg's own (its
application registered one, or changed `json.loads` globally) keeps its own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
from psycopg import Cursor, adapters, pq
from psycopg.adapt import Buffer, Loader
from psycopg.postgres import types as pg_types
from psycopg.types.json import JsonbBinaryLoader

from rota.db import Conn
from rota.jobs import Job, Status, StopSignal

_JSONB = pg_types["jsonb"].oid
_TIMESTAMPTZ = pg_types["timestamptz"].oid
_BINARY = pq.Format.BINARY

_DEFAULT_TIMESTAMPTZ = cast("type[Loader]", adapters.get_loader(_TIMESTAMPTZ, _BINARY))
"""psycopg's binary timestamptz loader (its C one when psycopg[binary] is installed)."""

_raw_decode = json.JSONDecoder().raw_decode


class UtcTimestamptz(Loader):
    """psycopg's own binary timestamptz loader, made without a connection: it then
    gives UTC datetimes and skips the move into the session's time zone.

    Its C class cannot be subclassed: this class only makes one (and has no
    `load` of its own, hence the cast where it is registered)."""

    format = _BINARY

    def __new__(cls, oid: int, context: Any = None) -> Any:
        return _DEFAULT_TIMESTAMPTZ(oid, None)


class JsonbText(JsonbBinaryLoader):
    """A jsonb value from the text PostgreSQL sends: one JSON value with nothing
    around it, so no encoding to guess and no whitespace to skip (anything else
    goes to `json.loads`, which reads or refuses it as before)."""

    def load(self, data: Buffer) -> Any:
        if not data or data[0] != 1:
            return super().load(data)  # an empty or unknown format: psycopg's own error
        text = str(data[1:], "utf-8")
        try:
            value, end = _raw_decode(text)
        except ValueError:
            end = -1
        if end != len(text):  # not one bare value: json.loads accepts it or says why not
            value = json.loads(text)
        return value


def claim_cursor(conn: Conn, row_factory: Any) -> Cursor[Any]:
    """A cursor of `conn` reading a claim's rows with the loaders above (where the
    connection's own are psycopg's defaults)."""
    cur = Cursor(conn, row_factory=row_factory)
    own = conn.adapters
    if own.get_loader(_TIMESTAMPTZ, _BINARY) is _DEFAULT_TIMESTAMPTZ:
        cur.adapters.register_loader(_TIMESTAMPTZ, cast("type[Loader]", UtcTimestamptz))
    if own.get_loader(_JSONB, _BINARY) is JsonbBinaryLoader and _default_json_loads():
        cur.adapters.register_loader(_JSONB, JsonbText)
    return cur


def _default_json_loads() -> bool:
    """Whether psycopg reads JSON with `json.loads` (nobody set another globally)."""
    return JsonbBinaryLoader._loads is json.loads


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


def jobs_of(cur: Cursor[tuple[Any, ...]]) -> list[Job]:
    """Claimed rows as jobs, in the order they should start.

    The claim returns a Job's columns in its field order, so each job is
    built positionally; any other shape is built by name.
    """
    # The hot statements return their rows in binary: the server sends each value
    # as stored instead of formatting it as text (timestamps above all), and
    # psycopg reads it without parsing.
    try:
        rows = cur.fetchall()  # first: in pipeline mode the description comes with the rows
        names = [column.name for column in cur.description or ()]
        build = _job if names == _JOB_FIELDS else _by_name(names)
        jobs = [build(row) for row in rows]
    except psycopg.OperationalError:
        raise
    except Exception:
        jobs = _row_by_row(cur)
    jobs.sort(key=_start_order)
    return jobs


def _start_order(job: Job) -> tuple[int, datetime, int]:
    return (job.priority, job.run_at, job.id)


def _by_name(names: list[str]) -> Callable[[tuple[Any, ...]], Job]:
    return lambda row: Job.from_row(dict(zip(names, row, strict=True)))


@dataclasses.dataclass(frozen=True, slots=True)
class Unreadable:
    """The payload of a job whose row could not be read: why not.

    The worker writes such a job dead at once, with the error
    `unreadable row: <reason>`, and runs no handler for it."""

    reason: str

    @property
    def error(self) -> str:
        return f"unreadable row: {self.reason}"


def _row_by_row(cur: Cursor[tuple[Any, ...]]) -> list[Job]:
    """The claim's rows read one at a time: a row that fails becomes an unreadable job."""
    names = [column.name for column in cur.description or ()]
    build = _job if names == _JOB_FIELDS else _by_name(names)
    jobs = []
    for index in range(cur.rowcount):
        cur.scroll(index, mode="absolute")
        try:
            row = cur.fetchone()
            assert row is not None
            jobs.append(build(row))
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            jobs.append(_unreadable(cur, names, index, exc, build))
    return jobs


_DROPPED = frozenset({"trace_context"})
"""Columns a job runs without: what cannot be read there is read as NULL.
The trace context is tracing data only, and no check of the table guards it."""


def _unreadable(
    cur: Cursor[Any],
    names: list[str],
    index: int,
    exc: Exception,
    build: Callable[[tuple[Any, ...]], Job],
) -> Job:
    """A job for row `index` that cannot be read: the columns that can, and the
    reason; or the job itself when only columns it runs without failed."""
    values: dict[str, Any] = {}
    reason = f"{type(exc).__name__}: {exc}"
    failed_in: set[str] = set()
    for column, name in enumerate(names):
        try:
            values[name] = _value(cur, index, column)
        except Exception as failed:
            if name in ("id", "attempts", "claims"):
                raise  # nothing to charge the row to: the claim itself is broken
            values[name] = None
            failed_in.add(name)
            reason = f"{name}: {type(failed).__name__}: {str(failed)[:200]}"
    if failed_in and failed_in <= _DROPPED:
        return build(tuple(values[name] for name in names))
    run_at = values.get("run_at")
    attempts = values["attempts"]
    job = object.__new__(Job)
    fields = {
        "id": values["id"],
        "type": values.get("type") or "",
        "payload": Unreadable(reason),
        "idempotency_key": None,
        "status": Status.RUNNING,
        "run_at": run_at if isinstance(run_at, datetime) else _EPOCH,
        "attempts": attempts,
        "claims": values["claims"],  # its lease is held by it: the outcome is written
        "max_attempts": values.get("max_attempts") or attempts,
        "priority": values.get("priority") or 0,
        "locked_by": values.get("locked_by"),
    }
    for field in dataclasses.fields(Job):
        if field.name == "cancelled":
            value: Any = StopSignal()
        elif field.name in fields:
            value = fields[field.name]
        else:
            value = field.default if field.default is not dataclasses.MISSING else None
        object.__setattr__(job, field.name, value)
    return job


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _value(cur: Cursor[Any], index: int, column: int) -> Any:
    """One value of the claim's result, read with the cursor's own loader."""
    result = cur.pgresult
    assert result is not None
    data = result.get_value(index, column)
    if data is None:
        return None
    loader = cur.adapters.get_loader(result.ftype(column), pq.Format(result.fformat(column)))
    if loader is None:
        return bytes(data)
    return loader(result.ftype(column), cur).load(data)
