"""What the console's buttons do, each with its audit row in the same transaction.

An action checks its input first and raises `InvalidInput` (400), `JobNotFound`
(404) or `Conflict` (409, e.g. retrying a running job) before anything is
written; otherwise the change and one ``rota.audit`` row (who, what, the ids or
the filter, how many rows) commit together or not at all. The levers
themselves are the core's (`rota.control`, `rota.schedule_store`); the console
adds only run-now and priority changes of ready jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb

from rota import control, flow, schedule_store, sql
from rota.db import Conn, fetch_all
from rota.errors import InvalidInput, JobNotFound, RotaError
from rota.jobs import Status
from rota.settings import QueueSettings
from rota.web.auth import Identity
from rota.web.filters import JobFilter

BULK_CAP = 100_000
"""Most jobs one bulk action changes; a filter that matches more is refused."""
SELECTION_CAP = 200
"""Most jobs ticked on a page one action takes (a page shows at most 200)."""


class Conflict(RotaError):
    """The job is not in a state this action applies to."""


@dataclasses.dataclass(frozen=True)
class Done:
    action: str
    rows: int
    message: str


@dataclasses.dataclass(frozen=True)
class Bulk:
    """What a bulk action applies to: the statuses it acts on, and extra conditions."""

    name: str
    statuses: tuple[Status, ...]
    delayed: bool = False
    verb: str = ""


BULK_ACTIONS = {
    "retry": Bulk("retry", control.RETRYABLE, verb="retried"),
    "cancel": Bulk("cancel", (Status.READY, Status.RUNNING, Status.WAITING), verb="cancelled"),
    "run-now": Bulk("run-now", (Status.READY,), delayed=True, verb="made due now"),
    "priority": Bulk("priority", (Status.READY,), verb="given the new priority"),
}


def bulk_action(name: str | None) -> Bulk:
    try:
        return BULK_ACTIONS[name or ""]
    except KeyError:
        raise InvalidInput(
            f"unknown bulk action {name!r} (one of: {', '.join(BULK_ACTIONS)})"
        ) from None


def _audit(
    conn: Conn, who: Identity, action: str, target: dict[str, Any], rows: int, now: datetime | None
) -> None:
    fetch_all(
        conn,
        sql.query("web_audit_insert"),
        {
            "now": now,
            "actor": who.name,
            "role": who.role,
            "action": action,
            "target": Jsonb(target),
            "rows": rows,
        },
    )


def _job_status(conn: Conn, job_id: int) -> Status:
    rows = fetch_all(conn, sql.query("job_states"), {"ids": [job_id]})
    if not rows:
        if control.missing(conn, [job_id]).archived:
            raise Conflict(f"job {job_id} is archived: {control.ARCHIVED}")
        raise JobNotFound(f"no job with id {job_id}")
    return Status(rows[0]["status"])


def retry_job(conn: Conn, who: Identity, job_id: int, now: datetime | None = None) -> Done:
    with conn.transaction():
        status = _job_status(conn, job_id)
        if status not in control.RETRYABLE:
            raise Conflict(f"job {job_id} is {status}: only dead, failed or cancelled jobs retry")
        result = control.retry_report(conn, [job_id], statuses=control.RETRYABLE, now=now)
        if job_id in result.left:  # a unique job whose key another job holds
            raise Conflict(f"job {job_id} is {status}, left as it was: {result.left[job_id]}")
        ids = result.revived
        _audit(conn, who, "retry", {"ids": [job_id]}, len(ids), now)
    return Done("retry", len(ids), f"job {job_id} is ready again")


def cancel_job(conn: Conn, who: Identity, job_id: int, now: datetime | None = None) -> Done:
    with conn.transaction():
        status = _job_status(conn, job_id)
        if status not in (Status.READY, Status.RUNNING, Status.WAITING):
            raise Conflict(
                f"job {job_id} is {status}: only ready, running or waiting jobs can be cancelled"
            )
        result = control.cancel(conn, [job_id], now=now)
        _audit(conn, who, "cancel", {"ids": [job_id]}, result.count, now)
    said = "cancelled" if result.ended else "asked to stop (its worker stops it within a heartbeat)"
    return Done("cancel", result.count, f"job {job_id} {said}")


def run_now(conn: Conn, who: Identity, job_id: int, now: datetime | None = None) -> Done:
    with conn.transaction():
        _job_status(conn, job_id)
        moved = fetch_all(conn, sql.query("web_run_now"), {"ids": [job_id], "now": now})
        if not moved:
            raise Conflict(f"job {job_id} is not a ready job waiting for a later run_at")
        _audit(conn, who, "run-now", {"ids": [job_id]}, len(moved), now)
    return Done("run-now", len(moved), f"job {job_id} is due now")


def set_priority(
    conn: Conn, who: Identity, job_id: int, priority: int, now: datetime | None = None
) -> Done:
    with conn.transaction():
        _job_status(conn, job_id)
        changed = fetch_all(
            conn, sql.query("web_set_priority"), {"ids": [job_id], "priority": priority}
        )
        if not changed:
            raise Conflict(f"job {job_id} is not ready: only ready jobs change priority")
        _audit(conn, who, "priority", {"ids": [job_id], "priority": priority}, len(changed), now)
    return Done("priority", len(changed), f"job {job_id} has priority {priority}")


def _statuses(bulk: Bulk, found: JobFilter) -> list[Status]:
    if found.status is None:
        return list(bulk.statuses)
    if found.status not in bulk.statuses:
        allowed = ", ".join(bulk.statuses)
        raise InvalidInput(f"{bulk.name} applies to {allowed} jobs, not to {found.status} ones")
    return [found.status]


def _bulk_params(bulk: Bulk, found: JobFilter, now: datetime | None) -> dict[str, Any]:
    return {**found.params(), "delayed": bulk.delayed, "now": now, "cap": BULK_CAP}


def bulk_count(conn: Conn, bulk: Bulk, found: JobFilter, now: datetime | None = None) -> int:
    """How many jobs the bulk action would change now (up to BULK_CAP + 1)."""
    params = _bulk_params(bulk, found, now)
    return sum(
        int(fetch_all(conn, sql.query("web_bulk_count"), {**params, "one": s})[0]["jobs"])
        for s in _statuses(bulk, found)
    )


def bulk_apply(
    conn: Conn,
    who: Identity,
    bulk: Bulk,
    found: JobFilter,
    priority: int | None = None,
    now: datetime | None = None,
) -> Done:
    params = _bulk_params(bulk, found, now)
    statuses = _statuses(bulk, found)
    if bulk.name == "priority" and priority is None:
        raise InvalidInput("give the new priority (0 runs first, 9 last)")
    with conn.transaction():
        ids = [
            r["id"]
            for s in statuses
            for r in fetch_all(conn, sql.query("web_bulk_ids"), {**params, "one": s})
        ]
        if len(ids) >= BULK_CAP:
            raise InvalidInput(f"the filter matches {BULK_CAP} jobs or more: narrow it down")
        rows = _bulk_change(conn, bulk, ids, priority, now) if ids else 0
        target: dict[str, Any] = {"filter": found.form(), "statuses": [*statuses]}
        if priority is not None:
            target["priority"] = priority
        _audit(conn, who, f"bulk-{bulk.name}", target, rows, now)
    return Done(f"bulk-{bulk.name}", rows, f"{rows} job(s) {bulk.verb}")


def selection_apply(
    conn: Conn,
    who: Identity,
    bulk: Bulk,
    ids: Sequence[int],
    priority: int | None = None,
    now: datetime | None = None,
) -> Done:
    """The action on the jobs ticked on a page: those of them in a state it applies
    to change (the others are left as they are and counted out in the message)."""
    chosen = sorted(set(ids))
    if not chosen:
        raise InvalidInput("tick at least one job")
    if len(chosen) > SELECTION_CAP:
        raise InvalidInput(f"at most {SELECTION_CAP} ticked jobs at once, not {len(chosen)}")
    if bulk.name == "priority" and priority is None:
        raise InvalidInput("give the new priority (0 runs first, 9 last)")
    params = {"ids": chosen, "delayed": bulk.delayed, "now": now}
    with conn.transaction():
        found = [
            r["id"]
            for s in bulk.statuses
            for r in fetch_all(conn, sql.query("web_selected_ids"), {**params, "one": s})
        ]
        rows = _bulk_change(conn, bulk, found, priority, now) if found else 0
        target: dict[str, Any] = {"ids": chosen, "statuses": [*bulk.statuses]}
        if priority is not None:
            target["priority"] = priority
        _audit(conn, who, f"selected-{bulk.name}", target, rows, now)
    skipped = len(chosen) - rows
    unmoved = f"; {skipped} not {', '.join(bulk.statuses)}, left as they are" if skipped else ""
    return Done(
        f"selected-{bulk.name}", rows, f"{rows} of {len(chosen)} job(s) {bulk.verb}{unmoved}"
    )


def _bulk_change(
    conn: Conn, bulk: Bulk, ids: list[int], priority: int | None, now: datetime | None
) -> int:
    if bulk.name == "retry":
        return len(control.retry(conn, ids, statuses=bulk.statuses, now=now))
    if bulk.name == "cancel":
        return control.cancel(conn, ids, now=now).count
    if bulk.name == "run-now":
        return len(fetch_all(conn, sql.query("web_run_now"), {"ids": ids, "now": now}))
    query = sql.query("web_set_priority")
    return len(fetch_all(conn, query, {"ids": ids, "priority": priority}))


def retry_dead_group(
    conn: Conn, who: Identity, job_type: str, error_class: str, now: datetime | None = None
) -> Done:
    if not job_type:
        raise InvalidInput("give the job type of the dead-letter group")
    params = {"type": job_type, "error_class": error_class, "cap": BULK_CAP}
    with conn.transaction():
        ids = [r["id"] for r in fetch_all(conn, sql.query("web_dead_group_ids"), params)]
        revived = control.retry(conn, ids, statuses=(Status.DEAD,), now=now) if ids else []
        target = {"type": job_type, "error_class": error_class}
        _audit(conn, who, "retry-dead-group", target, len(revived), now)
    shown = error_class or "no error class"
    return Done(
        "retry-dead-group", len(revived), f"{len(revived)} dead {job_type} job(s) ({shown}) retried"
    )


def pause_types(
    conn: Conn, who: Identity, types: Sequence[str] | None, now: datetime | None = None
) -> Done:
    with conn.transaction():
        newly = control.pause(conn, types, now=now)
        _audit(conn, who, "pause", {"types": list(types) if types else "*"}, len(newly), now)
    return Done("pause", len(newly), f"paused {', '.join(types) if types else 'every type'}")


def resume_types(
    conn: Conn, who: Identity, types: Sequence[str] | None, now: datetime | None = None
) -> Done:
    with conn.transaction():
        lifted = control.resume(conn, types)
        _audit(conn, who, "resume", {"types": list(types) if types else "*"}, len(lifted), now)
    return Done("resume", len(lifted), f"resumed {', '.join(types) if types else 'everything'}")


def set_limit(
    conn: Conn,
    who: Identity,
    job_type: str,
    limits: flow.Limit,
    now: datetime | None = None,
) -> Done:
    """Set a type's limits to those of `limits` (checked by rota.flow.set_limit:
    nothing is written when they are refused), audited."""
    with conn.transaction():
        flow.set_limit(
            conn,
            job_type,
            concurrency=limits.concurrency,
            group_concurrency=limits.group_concurrency,
            rate=limits.rate,
            per=limits.per,
            now=now,
        )
        target = {
            "type": job_type,
            "concurrency": limits.concurrency,
            "group_concurrency": limits.group_concurrency,
            "rate": limits.rate,
            "per": limits.per,
        }
        _audit(conn, who, "set-limit", target, 1, now)
    return Done("set-limit", 1, f"{job_type}: {limits.describe()}")


def clear_limit(conn: Conn, who: Identity, job_type: str, now: datetime | None = None) -> Done:
    with conn.transaction():
        cleared = flow.clear_limit(conn, job_type)
        _audit(conn, who, "clear-limit", {"type": job_type}, int(cleared), now)
    return Done("clear-limit", int(cleared), f"{job_type}: limits cleared")


def run_schedule(conn: Conn, who: Identity, name: str, now: datetime | None = None) -> Done:
    """The schedule's job now, outside its slots (suspended schedules too: a person
    asked for it), audited like every action. It holds the schedule's unique key,
    so a `Conflict` while unique_active or unique_for_seconds refuses it."""
    with conn.transaction():
        found = fetch_all(conn, sql.query("schedule_get"), {"name": name})
        if not found:
            raise JobNotFound(f"no schedule named {name!r}")
        row = found[0]
        # Its slot is the moment it was asked for, by the database's clock; it
        # has no idempotency key, so asking twice makes two jobs (a Forbid
        # schedule sees it as its latest job), and its group is the schedule's.
        [at] = fetch_all(conn, sql.query("database_now"), {"now": now})
        max_attempts = row["max_attempts"] or QueueSettings().default_max_attempts
        job_id = schedule_store.enqueue_job(
            conn, row, at["now"], key=None, run_at=at["now"], max_attempts=max_attempts, now=now
        )
        if job_id is None:
            raise Conflict(_key_held(conn, name, schedule_store.held_key(row)))
        _audit(conn, who, "run-schedule", {"schedule": name, "ids": [job_id]}, 1, now)
    return Done("run-schedule", 1, f"schedule {name}: job {job_id} enqueued now")


def _key_held(conn: Conn, name: str, key: str | None) -> str:
    """Why the schedule's uniqueness refused a run now, in one line."""
    held = fetch_all(conn, sql.query("web_schedule_key_holder"), {"key": key})[0]
    if held["active_id"] is not None:
        return (
            f"schedule {name}: job {held['active_id']} of it is still active and the schedule"
            " has unique_active: run now makes no second job until it ends"
        )
    if held["until"] is not None:
        until = held["until"].astimezone(UTC).isoformat(timespec="seconds")
        return (
            f"schedule {name}: its unique_for_seconds window runs until {until}:"
            " run now makes no job before then"
        )
    return f"schedule {name}: its key is held by another job: try again"


def suspend_schedule(
    conn: Conn, who: Identity, name: str, suspend: bool, now: datetime | None = None
) -> Done:
    action = "suspend" if suspend else "resume-schedule"
    with conn.transaction():
        row = schedule_store.set_suspended(conn, name, suspend, now=now)
        if row is None:
            raise JobNotFound(f"no schedule named {name!r}")
        _audit(conn, who, action, {"schedule": name}, 1, now)
    return Done(action, 1, f"schedule {name} {'suspended' if suspend else 'resumed'}")
