"""JobSchedule objects become schedule rows, and rows report back into status."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from kopf.testing import KopfRunner
from kube_client import Api, wait_for

from rota import schedule_store as schedules

NS = "default"
PATH = f"/apis/rota.dev/v1/namespaces/{NS}/jobschedules"


def job_schedule(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "rota.dev/v1",
        "kind": "JobSchedule",
        "metadata": {"name": name},
        "spec": {"jobType": "report.build", "schedule": "*/5 * * * *", **spec},
    }


def ready_condition(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or ():
        if condition["type"] == "Ready":
            return dict(condition)
    return None


def test_apply_change_and_delete(operator: KopfRunner, kube_api: Api, db_url: str) -> None:
    kube_api.create(PATH, job_schedule("nightly", payload={"format": "pdf"}))

    row = wait_for(lambda: schedules.get(db_url, "default/nightly"), what="the schedule row")
    assert (row["job_type"], row["cron"], row["payload"]) == (
        "report.build",
        "*/5 * * * *",
        {"format": "pdf"},
    )
    obj = wait_for(lambda: _with_status(kube_api, "nightly", "nextRunAt"), what="status.nextRunAt")
    assert obj["status"]["nextRunAt"] == row["next_run_at"].strftime("%Y-%m-%dT%H:%M:%SZ")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert ready_condition(obj)["status"] == "True"  # type: ignore[index]
    assert "rota.dev/finalizer" in obj["metadata"]["finalizers"]

    kube_api.patch(
        f"{PATH}/nightly", {"spec": {"schedule": "0 3 * * *", "timeZone": "Europe/Paris"}}
    )
    row = wait_for(
        lambda: (r := schedules.get(db_url, "default/nightly")) and r["cron"] == "0 3 * * *" and r,
        what="the changed row",
    )
    assert row["timezone"] == "Europe/Paris"
    wait_for(
        lambda: (
            (o := kube_api.get(f"{PATH}/nightly"))["status"].get("observedGeneration")
            == o["metadata"]["generation"]
        ),
        what="the new generation observed",
    )

    kube_api.delete(f"{PATH}/nightly")
    wait_for(lambda: schedules.get(db_url, "default/nightly") is None, what="the row removed")
    wait_for(lambda: kube_api.get(f"{PATH}/nightly") is None, what="the finalizer released")


def test_an_invalid_cron_is_a_condition_and_an_event(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    kube_api.create(PATH, job_schedule("broken", schedule="61 * * * *"))

    obj = wait_for(
        lambda: ready_condition(kube_api.get(f"{PATH}/broken")), what="a Ready condition"
    )
    assert (obj["status"], obj["reason"]) == ("False", "InvalidSpec")
    assert "61" in obj["message"]
    events = wait_for(lambda: kube_api.events(NS, "broken"), what="an event")
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "InvalidSpec")]
    assert schedules.get(db_url, "default/broken") is None

    # Fixing the spec makes it Ready and creates the row; deleting it still works.
    kube_api.patch(f"{PATH}/broken", {"spec": {"schedule": "1 * * * *"}})
    wait_for(lambda: schedules.get(db_url, "default/broken"), what="the row after the fix")
    wait_for(
        lambda: (ready_condition(kube_api.get(f"{PATH}/broken")) or {}).get("status") == "True",
        what="Ready=True after the fix",
    )


def test_an_unknown_time_zone_leaves_the_previous_row_alone(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    kube_api.create(PATH, job_schedule("zoned", timeZone="Europe/Berlin"))
    wait_for(lambda: schedules.get(db_url, "default/zoned"), what="the row")

    kube_api.patch(f"{PATH}/zoned", {"spec": {"timeZone": "Mars/Olympus_Mons"}})
    wait_for(
        lambda: (
            (ready_condition(kube_api.get(f"{PATH}/zoned")) or {}).get("reason") == "InvalidSpec"
        ),
        what="Ready=False",
    )
    assert schedules.get(db_url, "default/zoned")["timezone"] == "Europe/Berlin"  # type: ignore[index]


def test_the_timer_restores_a_row_removed_behind_its_back(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    kube_api.create(PATH, job_schedule("sticky"))
    wait_for(lambda: schedules.get(db_url, "default/sticky"), what="the row")
    schedules.remove(db_url, "default/sticky")
    wait_for(lambda: schedules.get(db_url, "default/sticky"), what="the row restored")


def _with_status(api: Api, name: str, field: str) -> dict[str, Any] | None:
    obj = api.get(f"{PATH}/{name}")
    return obj if obj and (obj.get("status") or {}).get(field) else None


def test_a_database_outage_is_retried_until_it_ends(
    run_operator: Callable[[str], AbstractContextManager[KopfRunner]],
    kube_api: Api,
    pg_server: Any,
    template_db: str,
) -> None:
    name = f"rota_late_{uuid.uuid4().hex[:8]}"
    late_url = pg_server.url(name)  # this database does not exist yet
    with run_operator(late_url):
        kube_api.create(PATH, job_schedule("patient"))
        condition = wait_for(
            lambda: ready_condition(kube_api.get(f"{PATH}/patient")), what="Ready=False"
        )
        assert (condition["status"], condition["reason"]) == ("False", "DatabaseUnavailable")

        pg_server.create(name, template=template_db)
        try:
            wait_for(
                lambda: schedules.get(late_url, "default/patient"), what="the row after the outage"
            )
            wait_for(
                lambda: (
                    (ready_condition(kube_api.get(f"{PATH}/patient")) or {}).get("status") == "True"
                ),
                what="Ready=True after the outage",
            )
        finally:
            kube_api.delete(f"{PATH}/patient")
            wait_for(lambda: kube_api.get(f"{PATH}/patient") is None, what="the object gone")
            pg_server.drop(name)


def test_a_payload_over_the_limit_is_invalid(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    kube_api.create(PATH, job_schedule("heavy", payload={"blob": "x" * 300_000}))
    condition = wait_for(lambda: ready_condition(kube_api.get(f"{PATH}/heavy")), what="Ready")
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert "payload" in condition["message"]
    assert schedules.get(db_url, "default/heavy") is None


def test_a_job_schedule_that_maps_onto_a_built_in_is_refused_and_leaves_it_alone(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    # `archive` in namespace `rota` would be the row rota/archive: the built-in
    # archive schedule. Creating it must not overwrite that row, nor deleting it remove it.
    builtin = schedules.get(db_url, "rota/archive")
    path = "/apis/rota.dev/v1/namespaces/rota/jobschedules"
    obj = job_schedule("archive", jobType="rota.archive", payload={"batch_size": 5})
    kube_api.create(path, {**obj, "metadata": {"name": "archive", "namespace": "rota"}})

    condition = wait_for(
        lambda: ready_condition(kube_api.get(f"{path}/archive")), what="a Ready condition"
    )
    assert (condition["status"], condition["reason"]) == ("False", "ReservedName")
    assert "built-in" in condition["message"]
    warnings = [e for e in kube_api.events("rota", "archive") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["ReservedName"]
    assert schedules.get(db_url, "rota/archive") == builtin

    kube_api.delete(f"{path}/archive")
    wait_for(lambda: kube_api.get(f"{path}/archive") is None, what="the object gone")
    assert schedules.get(db_url, "rota/archive") == builtin
    # Any other name in namespace rota is an ordinary schedule.
    kube_api.create(
        path, {**job_schedule("tick"), "metadata": {"name": "tick", "namespace": "rota"}}
    )
    wait_for(lambda: schedules.get(db_url, "rota/tick"), what="rota/tick written")


def test_unique_fields_reach_the_row_and_both_together_are_invalid(
    operator: KopfRunner, kube_api: Api, db_url: str
) -> None:
    kube_api.create(PATH, job_schedule("hourly", uniqueForSeconds=3600))
    row = wait_for(lambda: schedules.get(db_url, "default/hourly"), what="the schedule row")
    assert (row["unique_for_seconds"], row["unique_active"]) == (3600.0, False)
    kube_api.patch(f"{PATH}/hourly", {"spec": {"uniqueForSeconds": None, "uniqueActive": True}})
    wait_for(
        lambda: (r := schedules.get(db_url, "default/hourly")) and r["unique_active"],
        what="the row with uniqueActive",
    )
    assert schedules.get(db_url, "default/hourly")["unique_for_seconds"] is None  # type: ignore[index]

    kube_api.create(PATH, job_schedule("both", uniqueForSeconds=60, uniqueActive=True))
    obj = wait_for(lambda: ready_condition(kube_api.get(f"{PATH}/both")), what="a Ready condition")
    assert (obj["status"], obj["reason"]) == ("False", "InvalidSpec")
    assert "not both" in obj["message"]
    assert schedules.get(db_url, "default/both") is None
