"""WorkerPool bounds: a cap from the jobs, a pause switch, one controller per
target, and types no worker handles left out, each said in the status.

The emulator has no Deployment controller and no pods that get ready: the
pools here see pods that are slow to start, the case that used to run away.
"""

from __future__ import annotations

from typing import Any

import psycopg
from kopf.testing import KopfRunner
from kube_client import Api, wait_for
from test_workerpools import DEPLOYMENTS, NS, PODS, POOLS, add_ready_jobs, pod, worker_pool

from rota import workers

HPAS = f"/apis/autoscaling/v1/namespaces/{NS}/horizontalpodautoscalers"
SCALED_OBJECTS = f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects"


def worker_deployment(name: str, replicas: int, *args: str) -> dict[str, Any]:
    """A Deployment whose pods run `rota worker` with these arguments."""
    container = {"name": "worker", "image": "rota", "command": ["rota", "worker"], "args": args}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"spec": {"containers": [container]}},
        },
        "status": {"replicas": 0},  # pods that never start: an image pull that takes for ever
    }


def pool_status(api: Api, name: str) -> dict[str, Any]:
    return dict((api.get(f"{POOLS}/{name}") or {}).get("status") or {})


def condition(api: Api, name: str, type_: str) -> dict[str, Any]:
    found = pool_status(api, name).get("conditions") or []
    return next((c for c in found if c["type"] == type_), {})


def polls_seen(api: Api, name: str, count: int) -> None:
    """Wait until `count` more status writes happened (the pool keeps polling)."""
    for _ in range(count):
        before = (api.get(f"{POOLS}/{name}") or {}).get("metadata", {}).get("resourceVersion")
        wait_for(
            lambda b=before: api.get(f"{POOLS}/{name}")["metadata"]["resourceVersion"] != b,
            what="another poll",
        )


def test_old_jobs_and_slow_pods_ask_for_what_the_jobs_can_use(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, worker_deployment("slow", 0, "--concurrency=2"))
    add_ready_jobs(conn, 3, age_seconds=900, type_="email.send")
    kube_api.create(POOLS, worker_pool("slow", "slow", maxReplicas=10))
    wait_for(lambda: pool_status(kube_api, "slow").get("desiredReplicas") == 2, what="2")
    polls_seen(kube_api, "slow", 5)
    status = pool_status(kube_api, "slow")
    assert kube_api.get(f"{DEPLOYMENTS}/slow")["spec"]["replicas"] == 2
    assert (status["jobsPerReplica"], status["maxReplicasForJobs"]) == (2, 2)
    assert status["decidedBy"] == "CappedByJobs"
    assert (
        "2 jobs per replica from the target's --concurrency"
        in condition(kube_api, "slow", "Ready")["message"]
    )


def test_a_paused_pool_leaves_the_replicas_alone_until_resumed(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, worker_deployment("frozen", 1, "--concurrency=1"))
    add_ready_jobs(conn, 8, age_seconds=900, type_="email.send")
    kube_api.create(POOLS, worker_pool("frozen", "frozen", paused=True))
    wait_for(lambda: pool_status(kube_api, "frozen").get("decidedBy") == "Paused", what="Paused")
    polls_seen(kube_api, "frozen", 3)
    assert kube_api.get(f"{DEPLOYMENTS}/frozen")["spec"]["replicas"] == 1
    assert pool_status(kube_api, "frozen")["desiredReplicas"] == 1
    reasons = [e["reason"] for e in kube_api.events(NS, "frozen")]
    assert reasons.count("PoolPaused") == 1 and "Scaled" not in reasons

    kube_api.patch(f"{POOLS}/frozen", {"spec": {"paused": False}})
    wait_for(lambda: kube_api.get(f"{DEPLOYMENTS}/frozen")["spec"]["replicas"] == 5, what="grown")


def test_a_second_controller_on_the_target_stops_both_pools_and_says_so(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, worker_deployment("shared", 1))
    add_ready_jobs(conn, 50, age_seconds=900, type_="email.send")
    # The first is paused until the second exists, so that no poll runs with one alone.
    kube_api.create(POOLS, worker_pool("first", "shared", paused=True))
    kube_api.create(POOLS, worker_pool("second", "shared"))
    kube_api.patch(f"{POOLS}/first", {"spec": {"paused": False}})
    for name, other in (("first", "WorkerPool/second"), ("second", "WorkerPool/first")):
        ready = wait_for(
            lambda n=name: (
                condition(kube_api, n, "Ready").get("status") == "False"
                and condition(kube_api, n, "Ready")
            ),
            what=f"{name} not ready",
        )
        assert ready["reason"] == "ConflictingController"
        assert pool_status(kube_api, name)["conflictingControllers"] == [other]
        warnings = [e for e in kube_api.events(NS, name) if e["type"] == "Warning"]
        assert [e["reason"] for e in warnings] == ["ConflictingController"]
    polls_seen(kube_api, "first", 2)
    assert kube_api.get(f"{DEPLOYMENTS}/shared")["spec"]["replicas"] == 1

    kube_api.delete(f"{POOLS}/second")
    wait_for(lambda: kube_api.get(f"{DEPLOYMENTS}/shared")["spec"]["replicas"] > 1, what="scaling")
    wait_for(lambda: condition(kube_api, "first", "Ready")["status"] == "True", what="Ready")


def test_an_hpa_or_a_keda_scaled_object_on_the_target_is_a_conflict(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, worker_deployment("contested", 1))
    add_ready_jobs(conn, 50, age_seconds=900, type_="email.send")
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "contested"}
    kube_api.create(
        HPAS,
        {
            "apiVersion": "autoscaling/v1",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "cpu"},
            "spec": {"scaleTargetRef": ref, "maxReplicas": 3},
        },
    )
    kube_api.create(POOLS, worker_pool("contested", "contested"))
    wait_for(
        lambda: (
            pool_status(kube_api, "contested").get("conflictingControllers")
            == ["HorizontalPodAutoscaler/cpu"]
        ),
        what="the HPA named",
    )
    kube_api.delete(f"{HPAS}/cpu")
    kube_api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", KEDA_CRD)
    kube_api.create(
        SCALED_OBJECTS,
        {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "pg"},
            "spec": {"scaleTargetRef": {"name": "contested"}},
        },
    )
    wait_for(
        lambda: (
            pool_status(kube_api, "contested").get("conflictingControllers") == ["ScaledObject/pg"]
        ),
        what="the ScaledObject named",
    )
    assert kube_api.get(f"{DEPLOYMENTS}/contested")["spec"]["replicas"] == 1


def test_types_no_registered_worker_handles_are_not_counted(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    workers.register(conn, workers.WorkerInfo("w1", 1, ("email.send",), host="mailer-1"))
    kube_api.create(DEPLOYMENTS, worker_deployment("mailer", 1, "--concurrency=1"))
    kube_api.create(PODS, pod("mailer-1", "mailer"))
    add_ready_jobs(conn, 2, age_seconds=900, type_="email.send")
    add_ready_jobs(conn, 40, age_seconds=900, type_="nobody.handles")
    kube_api.create(POOLS, worker_pool("mailer", "mailer", jobTypes=None, maxReplicas=10))
    types = wait_for(
        lambda: (
            condition(kube_api, "mailer", "TypesHandled").get("status") == "False"
            and condition(kube_api, "mailer", "TypesHandled")
        ),
        what="TypesHandled False",
    )
    assert types["reason"] == "UnhandledTypes"
    assert "no live worker handles nobody.handles" in types["message"]
    status = pool_status(kube_api, "mailer")
    assert (status["handledTypes"], status["unhandledTypes"]) == (
        ["email.send"],
        ["nobody.handles"],
    )
    assert status["readyJobs"] == 2
    polls_seen(kube_api, "mailer", 3)
    assert kube_api.get(f"{DEPLOYMENTS}/mailer")["spec"]["replicas"] == 2
    warnings = [e for e in kube_api.events(NS, "mailer") if e["reason"] == "UnhandledTypes"]
    assert len(warnings) == 1


KEDA_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {
        "group": "keda.sh",
        "scope": "Namespaced",
        "names": {"kind": "ScaledObject", "plural": "scaledobjects", "singular": "scaledobject"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
