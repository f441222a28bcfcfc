"""Recurring schedules: validate, create, change, suspend and remove them.

The CLI and the operator both come through here, so a schedule is checked the
same way wherever it comes from: nothing invalid is ever stored. Every change
notifies channel ``rota_schedule`` so sleeping schedulers look again at once.
This module never enqueues jobs; that is the scheduler's work.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb

from rota import cron, limits, sql
from rota.db import Conn, ConnOrDsn, connection, fetch_all
from rota.errors import InvalidInput

POLICIES = ("Allow", "Forbid")
NOTIFY_CHANNEL = "rota_schedule"

RESERVED_PREFIX = "rota/"
"""Schedule names under this prefix belong to Rota's built-in schedules."""
BUILT_IN = {"rota/archive": "rota.archive"}
"""The built-in schedules (created by `rota migrate`) and the job type each runs."""


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """What a user asks for; the row adds next_run_at, last_slot and counters."""

    name: str
    job_type: str
    cron: str
    timezone: str = "UTC"
    payload: Any = None
    suspend: bool = False
    spread_seconds: int = 0
    concurrency_policy: str = "Allow"
    starting_deadline_seconds: int | None = None
    max_attempts: int | None = None
    priority: int | None = None
    """Priority of each slot's job (None: 0)."""
    timeout_seconds: float | None = None
    """Seconds each slot's job may run (None: the handler's or the worker's default)."""
    group: str | None = None
    """The concurrency group of each slot's job (see `rota.set_limit`)."""
    unique_for_seconds: float | None = None
    """A slot makes a job only this many seconds or more after the slot of the
    schedule's last job; the slots between are skipped (None: every slot)."""
    unique_active: bool = False
    """A slot makes no job (it is skipped) while a job of the schedule is ready, running
    or waiting."""


def validate(spec: ScheduleSpec) -> None:
    """Raise `InvalidInput` with a one-line reason unless the spec can be stored."""
    if not isinstance(spec, ScheduleSpec):
        raise InvalidInput(f"a schedule must be a ScheduleSpec, not {type(spec).__name__}")
    limits.name(spec.name, "schedule name")
    limits.name(spec.job_type, "job type")
    limits.text(spec.cron, "cron expression")
    if not isinstance(spec.suspend, bool):
        raise InvalidInput(f"suspend must be true or false, not {spec.suspend!r}")
    cron.Schedule(spec.cron, spec.timezone)
    limits.encode_payload(spec.payload)
    if spec.concurrency_policy not in POLICIES:
        raise InvalidInput(
            f"concurrency policy must be Allow or Forbid, not {spec.concurrency_policy!r}"
        )
    _check_int("spread_seconds", spec.spread_seconds, minimum=0)
    _check_int("starting_deadline_seconds", spec.starting_deadline_seconds, minimum=1)
    _check_int("max_attempts", spec.max_attempts, minimum=1)
    if spec.priority is not None:
        limits.priority(spec.priority)
    if spec.timeout_seconds is not None:
        limits.timeout_seconds(spec.timeout_seconds, "timeout_seconds")
    if spec.group is not None:
        limits.name(spec.group, "a group")
    limits.unique(spec.name, spec.unique_for_seconds, spec.unique_active)


def check_name(name: str, job_type: str | None = None, *, namespaced: bool = False) -> None:
    """Refuse a name reserved for the built-in schedules.

    A built-in may be changed (its settings are its payload) but must keep its
    job type; any other name under rota/ is refused, except a `namespaced` one
    (the operator's '<namespace>/<name>', whose namespace may be rota).
    """
    if name in BUILT_IN:
        if job_type is not None and job_type != BUILT_IN[name]:
            raise InvalidInput(
                f"{name} is the built-in schedule of {BUILT_IN[name]} jobs: it keeps that job type"
            )
    elif name.startswith(RESERVED_PREFIX) and not namespaced:
        raise InvalidInput(
            f"schedule names under {RESERVED_PREFIX} are reserved for built-in schedules: {name!r}"
        )


def _check_int(name: str, value: int | None, minimum: int) -> None:
    if value is None and name != "spread_seconds":
        return
    limits.whole(value, name, minimum)


def spread_offset(name: str, spread_seconds: int) -> int:
    """Whole seconds in [0, spread_seconds), the same for a name on every host and run."""
    if spread_seconds <= 0:
        return 0
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") % spread_seconds


def unique_key(schedule_id: int) -> str:
    """'schedule:<id>': the key every slot's job of a schedule with unique_for_seconds
    or unique_active holds beside its slot's idempotency key."""
    return f"schedule:{schedule_id}"


def held_key(row: Mapping[str, Any]) -> str | None:
    """The unique key a job of the schedule `row` holds: its `unique_key` when the
    schedule has unique_active or unique_for_seconds, else None."""
    if row["unique_active"] or row["unique_for_seconds"] is not None:
        return unique_key(row["id"])
    return None


def enqueue_job(
    conn: Conn,
    row: Mapping[str, Any],
    slot: datetime,
    *,
    key: str | None,
    run_at: datetime,
    max_attempts: int,
    now: datetime | None,
) -> int | None:
    """Insert a job of the schedule `row` for `slot` (a slot's, keyed `key`, or
    one asked for now, keyed by nothing); its id, or None when it was not made:
    the key has its job, or the schedule's unique_active or unique_for_seconds
    refused it (it holds the schedule's key, as every job of the schedule does)."""
    params = {
        "type": row["job_type"],
        "payload": Jsonb(row["payload"]),
        "key": key,
        "run_at": run_at,
        "max_attempts": max_attempts,
        "priority": row["priority"] if row["priority"] is not None else 0,
        "timeout_seconds": row["timeout_seconds"],
        "schedule_id": row["id"],
        "slot": slot,
        "group": row["group_key"],
        "unique_key": held_key(row),
        "unique_active": row["unique_active"],
        "unique_for": row["unique_for_seconds"],
        "now": now,
    }
    query = (
        "schedule_enqueue_slot_unique_for"
        if row["unique_for_seconds"] is not None
        else "schedule_enqueue_slot"
    )
    made = fetch_all(conn, sql.query(query), params)
    return int(made[0]["id"]) if made else None


def idempotency_key(schedule_id: int, slot: datetime) -> str:
    """'schedule:<id>:<slot in UTC, ISO-8601 to the second>', e.g. ...:2026-03-29T01:30:00+00:00."""
    return f"schedule:{schedule_id}:{slot.astimezone(UTC).isoformat(timespec='seconds')}"


def upsert(
    conn_or_dsn: ConnOrDsn,
    spec: ScheduleSpec,
    now: datetime | None = None,
    *,
    namespaced: bool = False,
) -> dict[str, Any]:
    """Create the schedule or change the one of that name; return its row.

    next_run_at is recomputed from now when the cron expression or time zone
    changes, and when a suspended schedule is resumed (the suspended period is
    not replayed); otherwise slots already due stay due.
    """
    validate(spec)
    limits.clock(now)
    check_name(spec.name, spec.job_type, namespaced=namespaced)
    encoded = limits.encode_payload(spec.payload)
    with connection(conn_or_dsn) as conn, conn.transaction():
        tick = _now(conn, now)
        params = {
            **dataclasses.asdict(spec),
            "payload": Jsonb(spec.payload, dumps=lambda _: encoded),
            "next_run_at": _first_slot(spec.cron, spec.timezone, tick),
            "now": now,
        }
        row = _one(conn, "schedule_insert", params)  # nothing when the name exists
        if row is None:
            old = _one(conn, "schedule_lock_by_name", {"name": spec.name})
            if old is not None and not _timing_changed(old, spec):
                params["next_run_at"] = old["next_run_at"]
            row = _one(conn, "schedule_update", params)
        _notify(conn, spec.name)
    if row is None:  # pragma: no cover - removed by someone else in between
        raise InvalidInput(f"schedule {spec.name!r} was removed while being changed")
    return row


def _timing_changed(old: dict[str, Any], spec: ScheduleSpec) -> bool:
    """Resumed, or other slots: a cron written another way (spacing, `@hourly` for
    `0 * * * *`) keeps its slots, and a slot already due stays due."""
    resumed = old["suspend"] and not spec.suspend
    return bool(
        resumed or old["timezone"] != spec.timezone or not cron.same_slots(old["cron"], spec.cron)
    )


def remove(conn_or_dsn: ConnOrDsn, name: str) -> bool:
    """Delete the schedule; its jobs stay. False when there was none of that name.
    A built-in schedule is never deleted (suspend it instead)."""
    limits.name(name, "schedule name")
    if name in BUILT_IN:
        raise InvalidInput(f"{name} is a built-in schedule: suspend it instead of removing it")
    with connection(conn_or_dsn) as conn, conn.transaction():
        gone = _one(conn, "schedule_delete", {"name": name}) is not None
        if gone:
            _notify(conn, name)
    return gone


def get(conn_or_dsn: ConnOrDsn, name: str) -> dict[str, Any] | None:
    limits.name(name, "schedule name")
    with connection(conn_or_dsn) as conn:
        return _one(conn, "schedule_get", {"name": name})


def list_all(conn_or_dsn: ConnOrDsn) -> list[dict[str, Any]]:
    with connection(conn_or_dsn) as conn:
        return fetch_all(conn, sql.query("schedule_list"))


def set_suspended(
    conn_or_dsn: ConnOrDsn, name: str, suspend: bool, now: datetime | None = None
) -> dict[str, Any] | None:
    """Suspend or resume; None when there is no schedule of that name."""
    limits.name(name, "schedule name")
    limits.clock(now)
    with connection(conn_or_dsn) as conn, conn.transaction():
        old = _one(conn, "schedule_lock_by_name", {"name": name})
        if old is None:
            return None
        fields = {f.name for f in dataclasses.fields(ScheduleSpec)}
        spec = ScheduleSpec(
            **{k: v for k, v in old.items() if k in fields}, group=old.get("group_key")
        )
        return upsert(conn, dataclasses.replace(spec, suspend=suspend), now=now, namespaced=True)


def _first_slot(expr: str, timezone: str, now: datetime) -> datetime:
    try:
        slot = cron.Schedule(expr, timezone).next_slot(now)
    except OverflowError:
        raise InvalidInput(
            f"the next slot after {now.isoformat()} lies past the year 9999"
        ) from None
    if slot is None:  # pragma: no cover - validate() refuses expressions that never fire
        raise InvalidInput(f"cron expression {expr!r} never fires")
    return slot


def _now(conn: Conn, now: datetime | None) -> datetime:
    row = _one(conn, "database_now", {"now": now})
    assert row is not None
    value: datetime = row["now"]
    return value


def _one(conn: Conn, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    rows = fetch_all(conn, sql.query(name), params)
    return rows[0] if rows else None


def _notify(conn: Conn, name: str) -> None:
    fetch_all(conn, sql.query("schedule_notify"), {"name": name})
