"""Edge values of JobSchedule and WorkerPool specs: what the CRDs admit, the
operator accepts and the database stores.

A value the CRD admits is either stored as written and reported Ready, or
refused with Ready=False and a reason that says what is wrong; never a handler
that retries for ever under the wrong reason, nor a status from an earlier poll
that reads as the current one.
"""

from __future__ import annotations

import json
import math
import pathlib
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, timedelta
from typing import Any

import jsonschema
import psycopg
import pytest
import yaml
from kopf.testing import KopfRunner
from kube_client import Api, wait_for
from test_jobschedules import PATH, job_schedule, ready_condition
from test_workerpools import DEPLOYMENTS, NS, POOLS, add_ready_jobs, deployment, worker_pool

from rota import cron
from rota import schedule_store as schedules
from rota.errors import InvalidInput
from rota_operator import jobschedules, pools
from rota_operator.conditions import rfc3339
from rota_operator.scaling import PoolLimits, QueueSample, ScaleMemory, decide

CRDS = pathlib.Path(__file__).parents[2] / "crds"
HANDLED = "rota.dev/last-handled-configuration"

SPACIOUS = {"ones": [1] * 100_000}
"""200 kB as compact JSON, under the payload limit Python measures; 300 kB as
PostgreSQL prints jsonb (a space after every comma), over the limit the
database measures: the schedule row is refused by the database alone."""
HUGE_NUMBERS = {"x": [1e300] * 900}
"""6 kB as compact JSON; 270 kB as PostgreSQL prints jsonb (every digit of 1e300)."""


def admitted(kind: str, spec: dict[str, Any]) -> bool:
    """Whether the CRD's structural schema admits an object with this spec."""
    crd = yaml.safe_load((CRDS / f"{kind.lower()}s.rota.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    validator = jsonschema.Draft4Validator(version["schema"]["openAPIV3Schema"])
    obj = {"apiVersion": "rota.dev/v1", "kind": kind, "metadata": {"name": "x"}, "spec": spec}
    return not list(validator.iter_errors(obj))


def handled_spec(api: Api, name: str) -> dict[str, Any] | None:
    """The spec kopf recorded once every handler of the object succeeded."""
    annotations = ((api.get(f"{PATH}/{name}") or {}).get("metadata") or {}).get("annotations")
    recorded = (annotations or {}).get(HANDLED)
    return json.loads(recorded).get("spec") if recorded else None


def status_of(api: Api, name: str) -> dict[str, Any]:
    """The object's status ({} before the operator wrote one)."""
    return dict((api.get(f"{PATH}/{name}") or {}).get("status") or {})


def current_ready(api: Api, name: str) -> dict[str, Any] | None:
    """The Ready condition once it speaks of the object's current generation."""
    obj = api.get(f"{PATH}/{name}")
    condition = ready_condition(obj)
    current = condition and condition.get("observedGeneration") == obj["metadata"]["generation"]
    return condition if current else None


# JobSchedule: a spec the database refuses.


def test_a_payload_only_the_database_refuses_is_an_invalid_spec_not_an_outage(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    kube_api.create(PATH, job_schedule("spacious", payload=SPACIOUS))

    condition = wait_for(lambda: current_ready(kube_api, "spacious"), what="a Ready condition")
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec"), condition
    assert "payload is 300010 bytes, over the limit of 262144" in condition["message"]
    events = wait_for(lambda: kube_api.events(NS, "spacious"), what="an event")
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "InvalidSpec")]
    # The handler is done with it (no retry for ever): kopf recorded the spec as handled.
    wait_for(lambda: handled_spec(kube_api, "spacious"), what="the spec handled")
    assert schedules.get(db_url, "default/spacious") is None

    kube_api.patch(f"{PATH}/spacious", {"spec": {"payload": {"ones": [1] * 10}}})
    row = wait_for(lambda: schedules.get(db_url, "default/spacious"), what="the row after the fix")
    assert row["payload"] == {"ones": [1] * 10}
    wait_for(
        lambda: (current_ready(kube_api, "spacious") or {}).get("status") == "True",
        what="Ready=True after the fix",
    )
    kube_api.delete(f"{PATH}/spacious")
    wait_for(lambda: schedules.get(db_url, "default/spacious") is None, what="the row removed")
    wait_for(lambda: kube_api.get(f"{PATH}/spacious") is None, what="the object gone")


def test_a_refused_change_keeps_the_row_and_says_why(
    operator: KopfRunner, kube_api: Api, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(PATH, job_schedule("refit", payload={"v": 1}))
    wait_for(lambda: (current_ready(kube_api, "refit") or {}).get("status") == "True", what="Ready")

    kube_api.patch(f"{PATH}/refit", {"spec": {"payload": HUGE_NUMBERS}})
    condition = wait_for(lambda: current_ready(kube_api, "refit"), what="the change judged")
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec"), condition
    # The status timer runs on (it mirrors the row's counters) and leaves the verdict alone.
    conn.execute("UPDATE rota.schedule SET missed_slots = 7 WHERE name = 'default/refit'")
    wait_for(
        lambda: status_of(kube_api, "refit").get("missedSlots") == 7,
        what="the timer's sync",
    )
    condition = current_ready(kube_api, "refit")
    assert condition and (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert schedules.get(db_url, "default/refit")["payload"] == {"v": 1}  # type: ignore[index]


def test_a_large_payload_is_recorded_by_its_digest(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    # kopf records the spec it handled in an annotation, and a real API server
    # holds at most 256 KiB of annotations an object: beside the copy `kubectl
    # apply` keeps, a payload of some 130 kB made every patch of the object
    # (status included) fail. The payload is recorded by its digest.
    big = {"blob": "x" * 200_000}
    kube_api.create(PATH, job_schedule("weighty", payload=big))
    wait_for(lambda: handled_spec(kube_api, "weighty"), what="the spec handled")
    annotations = kube_api.get(f"{PATH}/weighty")["metadata"]["annotations"]
    assert len(annotations[HANDLED]) < 2_000, len(annotations[HANDLED])
    assert schedules.get(db_url, f"{NS}/weighty")["payload"] == big  # type: ignore[index]

    changed = {"blob": "y" * 200_000}  # the payload alone: still a change to handle
    kube_api.patch(f"{PATH}/weighty", {"spec": {"payload": changed}})
    wait_for(
        lambda: schedules.get(db_url, f"{NS}/weighty")["payload"] == changed,  # type: ignore[index]
        what="the new payload stored",
    )


# JobSchedule: odd values the CRD admits.

LONG_NAME = ("a" * 240 + "-long.name")[:253]
ODD_BUT_VALID: dict[str, dict[str, Any]] = {
    LONG_NAME: {
        "schedule": "30 2 * * *",
        "timeZone": "Australia/Lord_Howe",  # half an hour of daylight saving
        "payload": {
            "名前": "Zoë 👋",
            "rtl": "\u05e9\u05dc\u05d5\u05dd",
            "combining": "e\u0301",
            "": [None, True, 0.1, 1e-7, 2**53 + 1, -(2**63)],
        },
    },
    "kathmandu": {
        "schedule": "45 23 31 12 *",
        "timeZone": "Asia/Kathmandu",
        "concurrencyPolicy": "Forbid",
        "priority": 9,
        "maxAttempts": 1000,
        "spreadSeconds": 86400,
        "startingDeadlineSeconds": 1,
        "timeoutSeconds": 315_360_000,
        "group": "tenant-ü 🌍",
        "uniqueForSeconds": 0.5,
    },
    "quartz": {
        "schedule": "0 0 ? * 1",
        "timeZone": "America/Argentina/ComodRivadavia",
        "payload": {"blob": "x" * 250_000},
        "uniqueActive": True,
    },
    "spring-forward": {"schedule": "30 2 * * *", "timeZone": "America/New_York"},
}
COLUMNS = {
    "schedule": "cron",
    "timeZone": "timezone",
    "payload": "payload",
    "concurrencyPolicy": "concurrency_policy",
    "priority": "priority",
    "maxAttempts": "max_attempts",
    "spreadSeconds": "spread_seconds",
    "startingDeadlineSeconds": "starting_deadline_seconds",
    "timeoutSeconds": "timeout_seconds",
    "group": "group_key",
    "uniqueForSeconds": "unique_for_seconds",
    "uniqueActive": "unique_active",
    "suspend": "suspend",
}


def test_odd_but_valid_values_round_trip_change_and_go(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    for name, spec in ODD_BUT_VALID.items():
        assert admitted("JobSchedule", job_schedule(name, **spec)["spec"]), name
        kube_api.create(PATH, job_schedule(name, **spec))

    for name, spec in ODD_BUT_VALID.items():
        row = wait_for(lambda n=name: schedules.get(db_url, f"{NS}/{n}"), what=f"row of {name}")
        stored = {field: row[COLUMNS[field]] for field in spec}
        assert stored == spec, name
        obj = wait_for(
            lambda n=name: status_of(kube_api, n).get("nextRunAt") and kube_api.get(f"{PATH}/{n}"),
            what=f"status of {name}",
        )
        assert ready_condition(obj)["status"] == "True", name  # type: ignore[index]
        assert obj["status"]["nextRunAt"] == rfc3339(row["next_run_at"])
        slots = cron.Schedule(row["cron"], row["timezone"])
        assert slots.next_slot(row["next_run_at"] - timedelta(seconds=1)) == row["next_run_at"]

    kube_api.patch(f"{PATH}/kathmandu", {"spec": {"concurrencyPolicy": "Allow", "group": None}})
    row = wait_for(
        lambda: (r := schedules.get(db_url, f"{NS}/kathmandu"))["group_key"] is None and r,  # type: ignore[index]
        what="the group gone",
    )
    assert row["concurrency_policy"] == "Allow"

    for name in ODD_BUT_VALID:
        kube_api.delete(f"{PATH}/{name}")
    for name in ODD_BUT_VALID:
        wait_for(lambda n=name: schedules.get(db_url, f"{NS}/{n}") is None, what=f"{name} removed")
        wait_for(lambda n=name: kube_api.get(f"{PATH}/{n}") is None, what=f"{name} gone")


def test_a_suspended_schedule_shows_no_next_run_until_resumed(
    operator: KopfRunner, kube_api: Api, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # The scheduler passes over a suspended row and a resume computes its next run
    # afresh: the slot stored at suspension is no run the scheduler will make.
    kube_api.create(PATH, job_schedule("held", schedule="0 9 * * *", suspend=True))
    wait_for(lambda: schedules.get(db_url, f"{NS}/held"), what="the row")
    conn.execute(
        "UPDATE rota.schedule SET next_run_at = now() - interval '3 days', missed_slots = 2"
        " WHERE name = 'default/held'"
    )
    status = wait_for(
        lambda: (s := status_of(kube_api, "held")).get("missedSlots") == 2 and s,
        what="the timer's sync",
    )
    assert ready_condition({"status": status})["status"] == "True"  # type: ignore[index]
    assert "nextRunAt" not in status, status

    kube_api.patch(f"{PATH}/held", {"spec": {"suspend": False}})
    row = wait_for(
        lambda: (r := schedules.get(db_url, f"{NS}/held")) and not r["suspend"] and r,
        what="resumed",
    )
    status = wait_for(
        lambda: (s := status_of(kube_api, "held")).get("nextRunAt") and s,
        what="the next run shown",
    )
    assert status["nextRunAt"] == rfc3339(row["next_run_at"])
    assert row["next_run_at"].astimezone(UTC).hour == 9


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("schedule", "R * * * *", "not classic cron"),
        ("schedule", "0 0 15W * *", "not classic cron"),
        ("schedule", "0 0 L * *", "day of month"),
        ("timeZone", "utc", "unknown time zone"),
        ("timeZone", " UTC", "unknown time zone"),
        ("group", " \t", "a group must be a non-empty string"),
        ("group", "é" * 600, "over the limit of 1024"),
        ("timeoutSeconds", 1e20, "at most 315360000"),
        ("uniqueForSeconds", 315_360_001, "at most 315360000"),
        ("startingDeadlineSeconds", 2**31, "at most 2147483647"),
        ("payload", {"s": "\x00"}, "NUL"),
    ],
)
def test_values_the_crd_admits_and_the_core_refuses_are_said_in_one_line(
    field: str, value: Any, said: str
) -> None:
    spec = {"jobType": "t", "schedule": "@daily", field: value}
    assert admitted("JobSchedule", spec)
    with pytest.raises(InvalidInput) as refused:
        jobschedules.to_spec(NS, "s", spec)
    assert said in str(refused.value) and "\n" not in str(refused.value)


# WorkerPool


def test_a_queue_age_target_the_crd_admits_never_breaks_the_decision() -> None:
    # exclusiveMinimum 0 admits the smallest double: the age over it is infinite.
    spec = {"scaleTargetRef": {"name": "w"}, "maxReplicas": 1000, "targetQueueAgeSeconds": 5e-324}
    assert admitted("WorkerPool", spec)
    limits = pools.PoolSpec.parse(spec, 15.0).limits
    for current in (0, 1, 7, 1000):
        decision = decide(limits, current, QueueSample(120.0, 10_000), ScaleMemory(), 0.0)
        step = max(current, 4)
        assert decision.desired == min(current + step, 1000), decision
        assert decision.reason in ("QueueTooOld", "ScaleFromZero", "OutOfBounds")
    huge = PoolLimits(0, 10, 1e-300, 0.0)
    assert decide(huge, 2, QueueSample(1e300, 50), ScaleMemory(), 0.0).desired == 6


@pytest.mark.parametrize("value", [0, -1, -0.0, math.nan, math.inf, 1e300, True, "30"])
def test_a_queue_age_target_out_of_range_is_refused(value: Any) -> None:
    spec = {"scaleTargetRef": {"name": "w"}, "maxReplicas": 3, "targetQueueAgeSeconds": value}
    with pytest.raises(ValueError, match="targetQueueAgeSeconds"):
        pools.PoolSpec.parse(spec, 15.0)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"minReplicas": -1, "maxReplicas": 3}, "minReplicas"),
        ({"maxReplicas": 2**31}, "maxReplicas"),
        ({"maxReplicas": 3, "jobsPerReplica": 0}, "jobsPerReplica"),
        ({"maxReplicas": 3, "scaleDownStabilizationSeconds": -1}, "scaleDownStabilizationSeconds"),
        ({"maxReplicas": 3, "pollIntervalSeconds": 0}, "pollIntervalSeconds"),
        ({"maxReplicas": 3, "jobTypes": [" "]}, "jobType"),
        ({"maxReplicas": 3, "paused": "false"}, "paused"),
    ],
)
def test_pool_bounds_past_the_crd_are_refused_by_name(spec: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        pools.PoolSpec.parse({"scaleTargetRef": {"name": "w"}, **spec}, 15.0)


def test_a_failed_poll_does_not_keep_the_last_decision(
    run_operator: Callable[[str], AbstractContextManager[KopfRunner]],
    kube_api: Api,
    pg_server: Any,
    template_db: str,
) -> None:
    name = f"rota_pool_{uuid.uuid4().hex[:8]}"
    url = pg_server.create(name, template=template_db)
    try:
        with run_operator(url), psycopg.connect(url, autocommit=True) as conn:
            add_ready_jobs(conn, 3, age_seconds=5, type_="email.send")
            kube_api.create(DEPLOYMENTS, deployment("cut", 1))
            kube_api.create(POOLS, worker_pool("cut", "cut", maxReplicas=3))
            wait_for(lambda: _pool(kube_api).get("readyJobs") == 3, what="a first decision")
            conn.close()

            pg_server.drop(name)
            ready = wait_for(
                lambda: (c := _ready(kube_api)) and c["status"] == "False" and c,
                what="Ready=False",
            )
            assert ready["reason"] == "DatabaseUnavailable"
            status = _pool(kube_api)
            assert status["decidedBy"] == "DatabaseUnavailable", status
            unknown = ("oldestReadyAgeSeconds", "readyJobs", "runningJobs", "busyReplicas")
            assert not set(unknown) & set(status), status
            assert status["desiredReplicas"] == status["currentReplicas"] == 1
            warnings = [e["reason"] for e in kube_api.events(NS, "cut") if e["type"] == "Warning"]
            assert warnings == ["DatabaseUnavailable"]

            pg_server.create(name, template=template_db)
            status = wait_for(
                lambda: (s := _pool(kube_api)).get("readyJobs") == 0 and s, what="measured again"
            )
            assert status["decidedBy"] != "DatabaseUnavailable"
            assert (_ready(kube_api) or {}).get("status") == "True"
            kube_api.delete(f"{POOLS}/cut")
            wait_for(lambda: kube_api.get(f"{POOLS}/cut") is None, what="the pool gone")
    finally:
        pg_server.drop(name)


def _pool(api: Api) -> dict[str, Any]:
    return dict((api.get(f"{POOLS}/cut") or {}).get("status") or {})


def _ready(api: Api) -> dict[str, Any] | None:
    return next((c for c in _pool(api).get("conditions") or () if c["type"] == "Ready"), None)
