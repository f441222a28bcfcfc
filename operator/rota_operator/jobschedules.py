"""A JobSchedule object and its rota.schedule row, in both directions.

The spec becomes a `rota.schedule_store.ScheduleSpec` (validated by the core, so the
CLI and the operator accept exactly the same schedules); the row becomes the
object's status. No kopf and no Kubernetes calls here: the handlers do the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rota import archive
from rota import schedule_store as core
from rota.errors import InvalidInput
from rota_operator.conditions import rfc3339, with_condition

API_VERSION = "rota.dev/v1"
KIND = "JobSchedule"


class ReservedName(InvalidInput):
    """The JobSchedule maps onto the row of a built-in schedule."""


def row_name(namespace: str, name: str) -> str:
    """The schedule row behind a JobSchedule: '<namespace>/<name>'."""
    return f"{namespace}/{name}"


def reserved(namespace: str, name: str) -> bool:
    """Whether the object's row would be a built-in schedule's (e.g. `archive` in
    namespace `rota` is rota/archive): such an object never touches the row."""
    return row_name(namespace, name) in core.BUILT_IN


def to_spec(namespace: str, name: str, spec: Mapping[str, Any]) -> core.ScheduleSpec:
    """The core's ScheduleSpec for this object; InvalidInput when the spec cannot be one.

    The core's `validate` is the judge (cron, time zone, payload size; and the
    archiver's settings for a schedule of archive jobs), so the CLI and the
    operator accept exactly the same schedules.
    """
    if reserved(namespace, name):
        raise ReservedName(
            f"{row_name(namespace, name)} is a built-in schedule of Rota: rename this"
            " JobSchedule or move it to another namespace (the built-in is left alone)"
        )
    payload = spec.get("payload")
    if payload is not None and not isinstance(payload, Mapping):
        raise InvalidInput("payload must be a JSON object")
    for field in ("jobType", "schedule"):
        if not isinstance(spec.get(field), str) or not spec.get(field):
            raise InvalidInput(f"spec.{field} is required")
    try:
        result = _spec_of(namespace, name, spec, payload)
    except (TypeError, ValueError) as exc:  # e.g. spreadSeconds: "soon"
        raise InvalidInput(f"spec: {exc}") from None
    core.validate(result)
    archive.check_schedule(result.job_type, result.payload)
    return result


def _spec_of(namespace: str, name: str, spec: Mapping[str, Any], payload: Any) -> core.ScheduleSpec:
    return core.ScheduleSpec(
        name=row_name(namespace, name),
        job_type=spec["jobType"],
        cron=spec["schedule"],
        timezone=spec.get("timeZone") or "UTC",
        payload=dict(payload) if payload is not None else None,
        suspend=bool(spec.get("suspend", False)),
        spread_seconds=int(spec.get("spreadSeconds") or 0),
        concurrency_policy=spec.get("concurrencyPolicy") or "Allow",
        starting_deadline_seconds=spec.get("startingDeadlineSeconds"),
        max_attempts=spec.get("maxAttempts"),
        priority=spec.get("priority"),
        timeout_seconds=spec.get("timeoutSeconds"),
        group=spec.get("group"),
        unique_for_seconds=spec.get("uniqueForSeconds"),
        unique_active=spec.get("uniqueActive", False),
    )


def synced_status(
    row: Mapping[str, Any], status: Mapping[str, Any], generation: int | None
) -> dict[str, Any]:
    """Status after the row was written for this generation: Ready=True, row fields."""
    message = f"schedule row {row['name']} is in step with the spec"
    return {
        **row_status(row),
        "observedGeneration": generation,
        "conditions": with_condition(
            status.get("conditions"), "Ready", True, "Synced", message, generation
        ),
    }


def row_status(row: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields that mirror the row (refreshed by the timer).

    A suspended row has no next run: the scheduler passes over it, and a resume
    computes the next slot afresh (the one stored is never enqueued)."""
    return {
        "nextRunAt": None if row.get("suspend") else rfc3339(row.get("next_run_at")),
        "lastSlot": rfc3339(row.get("last_slot")),
        "missedSlots": int(row.get("missed_slots") or 0),
    }


def invalid_status(
    status: Mapping[str, Any], generation: int | None, message: str, reason: str = "InvalidSpec"
) -> dict[str, Any]:
    """Status of a spec the core refuses: Ready=False; the row (if any) is left alone."""
    return {
        "observedGeneration": generation,
        "conditions": with_condition(
            status.get("conditions"), "Ready", False, reason, message, generation
        ),
    }


def unavailable_status(
    status: Mapping[str, Any], generation: int | None, message: str
) -> dict[str, Any]:
    """Status while the database cannot be reached: Ready=False until a retry succeeds."""
    return {
        "conditions": with_condition(
            status.get("conditions"), "Ready", False, "DatabaseUnavailable", message, generation
        ),
    }


def is_ready(status: Mapping[str, Any]) -> bool:
    """Whether the last reconcile left the object Ready=True."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
