"""Two installations in one cluster: each operator handles only its own objects.

Two real operator processes (`python -m rota_operator`, as the image runs it)
watch the emulator: `blue` watches team-a, `green` watches team-a and team-b.
Where they overlap (team-a) the rota.dev/instance label decides; an object
without the label belongs to neither. Finalizers and kopf's annotations carry
the instance, so neither ever touches the other's bookkeeping.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kube_client import Api, wait_for
from test_workerpools import worker_pool

from rota import schedule_store as schedules

ContextFactory = Callable[..., contextlib.AbstractContextManager[subprocess.Popen[bytes]]]


def schedules_path(namespace: str) -> str:
    return f"/apis/rota.dev/v1/namespaces/{namespace}/jobschedules"


def schedule(name: str, instance: str | None) -> dict[str, Any]:
    labels = {"rota.dev/instance": instance} if instance else {}
    return {
        "apiVersion": "rota.dev/v1",
        "kind": "JobSchedule",
        "metadata": {"name": name, "labels": labels},
        "spec": {"jobType": f"{name}.job", "schedule": "@hourly"},
    }


@pytest.fixture
def start_operator(kube_api: Api, tmp_path: pathlib.Path, db_url: str) -> Iterator[ContextFactory]:
    assert kube_api.emulator is not None
    kube_api.emulator.namespaces |= {"team-a", "team-b"}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube_api.kubeconfig())

    @contextlib.contextmanager
    def start(instance: str, namespaces: str) -> Iterator[subprocess.Popen[bytes]]:
        env = dict(
            os.environ,
            KUBECONFIG=str(kubeconfig),
            ROTA_DATABASE_URL=db_url,
            ROTA_STANDALONE="true",
            ROTA_METRICS_PORT="-1",
            ROTA_SCHEDULE_SYNC_SECONDS="1",
            ROTA_INSTANCE=instance,
            ROTA_NAMESPACES=namespaces,
        )
        log = open(tmp_path / f"{instance}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "rota_operator"], env=env, stdout=log, stderr=log
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
            log.close()

    yield start


def test_two_installations_each_reconcile_only_their_own(
    start_operator: ContextFactory, kube_api: Api, db_url: str
) -> None:
    for namespace in ("team-a", "team-b"):
        kube_api.create(
            f"/apis/apps/v1/namespaces/{namespace}/deployments",
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "workers"},
             "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "w"}}}},
        )  # fmt: skip
    kube_api.create(schedules_path("team-a"), schedule("blue-a", "blue"))
    kube_api.create(schedules_path("team-a"), schedule("green-a", "green"))
    kube_api.create(schedules_path("team-b"), schedule("blue-b", "blue"))  # not watched by blue
    kube_api.create(schedules_path("team-b"), schedule("green-b", "green"))
    kube_api.create(schedules_path("team-a"), schedule("nobody", None))
    pool = worker_pool("green-pool", "workers", maxReplicas=3)
    pool["metadata"]["labels"] = {"rota.dev/instance": "green"}
    kube_api.create("/apis/rota.dev/v1/namespaces/team-b/workerpools", pool)

    with start_operator("blue", "team-a"), start_operator("green", "team-a,team-b"):
        for row in ("team-a/blue-a", "team-a/green-a", "team-b/green-b"):
            # Two operator processes start on a loaded machine: a generous deadline.
            wait_for(lambda r=row: schedules.get(db_url, r), timeout=120, what=f"row {row}")
        pool_status = wait_for(
            lambda: (
                kube_api.get("/apis/rota.dev/v1/namespaces/team-b/workerpools/green-pool")
                .get("status", {})
                .get("decidedBy")
            ),
            timeout=60,
            what="the green pool decided",
        )
        assert pool_status
        # The green pool scaled its own Deployment (empty queue: down to 0 once the
        # 2 s window has passed); team-a's, which no pool targets, keeps 3.
        wait_for(
            lambda: (
                kube_api.get("/apis/apps/v1/namespaces/team-b/deployments/workers")["spec"][
                    "replicas"
                ]
                == 0
            ),
            timeout=60,
            what="team-b scaled by green",
        )
        for name, instance in (("blue-a", "blue"), ("green-a", "green")):
            obj = kube_api.get(f"{schedules_path('team-a')}/{name}")
            assert obj["metadata"]["finalizers"] == [f"{instance}.rota.dev/finalizer"]
            keys = [k for k in obj["metadata"].get("annotations", {}) if "rota.dev" in k]
            assert keys and all(k.startswith(f"{instance}.rota.dev/") for k in keys), keys
        for namespace, name in (("team-b", "blue-b"), ("team-a", "nobody")):
            obj = kube_api.get(f"{schedules_path(namespace)}/{name}")
            assert not obj["metadata"].get("finalizers") and not obj.get("status"), obj
            assert schedules.get(db_url, f"{namespace}/{name}") is None
        team_a = kube_api.get("/apis/apps/v1/namespaces/team-a/deployments/workers")
        assert team_a["spec"]["replicas"] == 3

        kube_api.delete(f"{schedules_path('team-a')}/green-a")
        wait_for(
            lambda: schedules.get(db_url, "team-a/green-a") is None, timeout=60, what="removed"
        )
        wait_for(
            lambda: kube_api.get(f"{schedules_path('team-a')}/green-a") is None,
            timeout=60,
            what="gone",
        )
        assert schedules.get(db_url, "team-a/blue-a") is not None
