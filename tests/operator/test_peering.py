"""With peering on, the operator records itself in the peering object and still acts."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from kopf.testing import KopfRunner
from kube_client import Api, wait_for

from rota import schedule_store as schedules

PEERING = "/apis/kopf.dev/v1/clusterkopfpeerings"


def test_the_operator_joins_the_peering_object(
    run_operator: Callable[..., AbstractContextManager[KopfRunner]], kube_api: Api, db_url: str
) -> None:
    kube_api.create(
        PEERING,
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": "rota-operator"},
        },
    )
    with run_operator(db_url, standalone=False):
        peers = wait_for(
            lambda: (kube_api.get(f"{PEERING}/rota-operator") or {}).get("status"),
            what="a peer record",
        )
        (record,) = peers.values()
        assert record["priority"] > 0  # a random priority, distinct per replica

        schedule: dict[str, Any] = {
            "apiVersion": "rota.dev/v1",
            "kind": "JobSchedule",
            "metadata": {"name": "peered"},
            "spec": {"jobType": "t", "schedule": "@hourly"},
        }
        kube_api.create("/apis/rota.dev/v1/namespaces/default/jobschedules", schedule)
        wait_for(lambda: schedules.get(db_url, "default/peered"), what="the row")
