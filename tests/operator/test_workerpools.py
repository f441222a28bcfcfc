"""WorkerPool: the operator scales a Deployment on the age of the queue.

The emulator has no Deployment controller, so `controller()` plays it: it
copies spec.replicas into status.replicas, as running pods would.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import psycopg
from kopf.testing import KopfRunner
from kube_client import Api, wait_for
from prometheus_client import generate_latest

import rota
from rota import workers
from rota_operator import kube, metrics
from tests.acceptance.procs import WorkerProcess

NS = "default"
PODS = f"/api/v1/namespaces/{NS}/pods"
POOLS = f"/apis/rota.dev/v1/namespaces/{NS}/workerpools"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


def deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
        "status": {"replicas": replicas},
    }


def pod(name: str, app: str) -> dict[str, Any]:
    """A pod the Deployment `app` would own (the emulator stores it, never runs it)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": app}}}


def worker_pool(name: str, target: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "rota.dev/v1",
        "kind": "WorkerPool",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": target},
            "jobTypes": ["email.send"],
            "minReplicas": 0,
            "maxReplicas": 5,
            "targetQueueAgeSeconds": 10,
            "scaleDownStabilizationSeconds": 2,
            "pollIntervalSeconds": 1,
            **spec,
        },
    }


def controller(api: Api, name: str) -> int:
    """Play the Deployment controller once; return the replicas now running."""
    obj = api.get(f"{DEPLOYMENTS}/{name}")
    wanted = obj["spec"]["replicas"]
    if obj.get("status", {}).get("replicas") != wanted:
        api.patch(f"{DEPLOYMENTS}/{name}/status", {"status": {"replicas": wanted}})
    return int(wanted)


def add_ready_jobs(conn: psycopg.Connection[Any], count: int, age_seconds: int, type_: str) -> None:
    conn.execute(
        "INSERT INTO rota.job (type, run_at)"
        " SELECT %(type)s, now() - make_interval(secs => %(age)s) FROM generate_series(1, %(n)s)",
        {"type": type_, "age": age_seconds, "n": count},
    )


def test_grows_with_an_old_queue_and_shrinks_after_it_drains(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, deployment("mailers", 0))
    add_ready_jobs(conn, 20, age_seconds=120, type_="email.send")
    add_ready_jobs(conn, 50, age_seconds=900, type_="other.type")  # not this pool's business
    kube_api.create(POOLS, worker_pool("mail", "mailers"))

    wait_for(lambda: controller(kube_api, "mailers") == 5, what="5 replicas (4, then 5)")
    pool = wait_for(lambda: _status(kube_api, "mail", "currentReplicas", 5), what="status")
    assert pool["status"]["desiredReplicas"] == 5
    assert pool["status"]["readyJobs"] == 20
    assert pool["status"]["oldestReadyAgeSeconds"] >= 120
    assert pool["status"]["lastScaleTime"]
    scaled = [e for e in kube_api.events(NS, "mail") if e["reason"] == "Scaled"]
    assert scaled[0]["type"] == "Normal"
    assert scaled[0]["message"].startswith("ScaleFromZero: 0 -> 4 replicas; 20 ready jobs")
    exposition = generate_latest(metrics.REGISTRY).decode()
    assert 'rota_workerpool_replicas{kind="desired",pool="default/mail"} 5.0' in exposition

    conn.execute(
        "UPDATE rota.job SET status = 'done', finished_at = now() WHERE type = 'email.send'"
    )
    wait_for(lambda: controller(kube_api, "mailers") == 0, what="scaled to zero")
    messages = [e["message"] for e in kube_api.events(NS, "mail") if e["reason"] == "Scaled"]
    assert messages[-1].startswith("QueueEmpty: 5 -> 0 replicas; 0 ready jobs")


def test_zero_to_one_as_soon_as_one_job_is_ready(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, deployment("idle", 0))
    kube_api.create(POOLS, worker_pool("idle", "idle", scaleDownStabilizationSeconds=600))
    wait_for(lambda: _status(kube_api, "idle", "desiredReplicas", 0), what="a first poll")

    add_ready_jobs(conn, 1, age_seconds=0, type_="email.send")
    wait_for(lambda: controller(kube_api, "idle") == 1, what="one replica")


def test_a_missing_deployment_is_a_condition_not_a_crash(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(POOLS, worker_pool("orphan", "nowhere"))
    condition = wait_for(lambda: _ready(kube_api, "orphan"), what="a Ready condition")
    assert (condition["status"], condition["reason"]) == ("False", "TargetNotFound")
    warnings = [e for e in kube_api.events(NS, "orphan") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["TargetNotFound"]

    kube_api.create(DEPLOYMENTS, deployment("nowhere", 2))
    condition = wait_for(
        lambda: (c := _ready(kube_api, "orphan")) and c["status"] == "True" and c,
        what="Ready once the Deployment exists",
    )
    assert condition["reason"] == "Stabilizing"  # empty queue, but no shrink before the window


def _status(api: Api, name: str, field: str, value: Any) -> dict[str, Any] | None:
    obj = api.get(f"{POOLS}/{name}")
    return obj if (obj.get("status") or {}).get(field) == value else None


def _ready(api: Api, name: str) -> dict[str, Any] | None:
    conditions = (api.get(f"{POOLS}/{name}").get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), None)


def test_deleting_a_pool_stops_its_polling(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, deployment("short", 0))
    kube_api.create(POOLS, worker_pool("short", "short"))
    wait_for(lambda: _status(kube_api, "short", "desiredReplicas", 0), what="a first poll")
    kube_api.delete(f"{POOLS}/short")
    wait_for(lambda: kube_api.get(f"{POOLS}/short") is None, what="the pool gone")
    exposition = wait_for(
        lambda: (
            (text := generate_latest(metrics.REGISTRY).decode())
            and 'pool="default/short"' not in text
        ),
        what="its series dropped",
    )
    assert exposition


def test_long_jobs_on_an_empty_queue_hold_the_replicas_that_run_them(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any], db_url: str
) -> None:
    # Two real workers each run a long job; nothing is ready. The old policy sent
    # the pool to 1 after the window, stopping a job mid-way.
    conn.execute("CREATE TABLE started (job_id bigint, attempt int)")
    conn.execute("CREATE TABLE gate (job_id bigint PRIMARY KEY)")
    host = socket.gethostname()  # a worker's host name: in a cluster, its pod's name
    kube_api.create(DEPLOYMENTS, deployment("longs", 3))
    for name in (host, "longs-idle"):
        kube_api.create(PODS, pod(name, "longs"))
    ids = rota.enqueue_many(conn, [rota.NewJob("gated"), rota.NewJob("gated")])
    for _ in ids:
        WorkerProcess(db_url, "--types", "gated", "--concurrency", "1", "--no-scheduler")
    wait_for(lambda: _count(conn, "SELECT count(*) FROM started") == 2, what="both jobs running")

    kube_api.create(POOLS, worker_pool("longs", "longs", jobTypes=["gated"],
                                       scaleDownStabilizationSeconds=1))  # fmt: skip
    start = time.monotonic()
    # Down to the two busy replicas, never below, for polls well past the window.
    pool = wait_for(
        lambda: (
            time.monotonic() - start > 6 and _status(kube_api, "longs", "decidedBy", "JobsRunning")
        ),
        what="six seconds of polls deciding by the running jobs",
    )
    assert controller(kube_api, "longs") == 2
    status = pool["status"]
    assert (status["runningJobs"], status["minReplicasForRunningJobs"]) == (2, 2)
    scaled = [e["message"] for e in kube_api.events(NS, "longs") if e["reason"] == "Scaled"]
    assert [m.split(";")[0] for m in scaled] == ["JobsRunning: 3 -> 2 replicas"], scaled
    # The busy pod was marked dearer to stop than the idle one before the scale-down.
    costs = {
        p["metadata"]["name"]: p["metadata"]["annotations"][kube.DELETION_COST]
        for p in kube_api.get(PODS)["items"]
    }
    assert costs == {host: "2", "longs-idle": "0"}
    assert _count(conn, "SELECT count(*) FROM rota.job WHERE status = 'running'") == 2

    conn.execute("INSERT INTO gate SELECT unnest(%s::bigint[])", (ids,))
    wait_for(lambda: controller(kube_api, "longs") == 0, what="scaled to zero once they finish")
    attempts = conn.execute("SELECT attempts, status FROM rota.job").fetchall()
    assert [(r["attempts"], r["status"]) for r in attempts] == [(1, "done"), (1, "done")]


def _count(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(next(iter(row.values())))


def test_jobs_a_limit_holds_back_do_not_scale_the_pool(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    """Old jobs that only a concurrency limit keeps waiting: more workers would
    not start them sooner, so the pool keeps one replica and says why."""
    kube_api.create(DEPLOYMENTS, deployment("payers", 1))
    add_ready_jobs(conn, 10, age_seconds=900, type_="payment")
    conn.execute("INSERT INTO rota.job_limit (type, concurrency) VALUES ('payment', 2)")
    conn.execute(
        "UPDATE rota.job SET status = 'running', locked_by = 'w', attempts = 1,"
        " locked_until = now() + interval '1 hour'"
        " WHERE id IN (SELECT id FROM rota.job ORDER BY id LIMIT 2)"
    )
    kube_api.create(POOLS, worker_pool("pay", "payers", jobTypes=["payment"]))
    pool = wait_for(lambda: _status(kube_api, "pay", "limitedTypes", ["payment"]), what="status")
    assert pool["status"]["readyJobs"] == 0
    assert pool["status"]["desiredReplicas"] == 1  # the two running jobs keep one
    limited = [e for e in kube_api.events(NS, "pay") if e["reason"] == "Limited"]
    assert [e["message"] for e in limited] == ["a limit holds jobs of payment back: not scaled for"]
    assert "held back by limits (not scaled for): payment" in _ready(kube_api, "pay")["message"]  # type: ignore[index]


def test_only_the_workers_of_the_targets_pods_count(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    """Workers of another Deployment and one outside Kubernetes share the database
    and the pool's types: their jobs are no floor for the pool."""
    kube_api.create(DEPLOYMENTS, deployment("senders", 2))
    kube_api.create(DEPLOYMENTS, deployment("others", 5))
    hosts = {"senders": ["senders-a", "senders-b"], "others": [f"others-{i}" for i in range(5)]}
    for app, names in hosts.items():
        for name in names:
            kube_api.create(PODS, pod(name, app))
    # The pool's own workers run one job at a time; the others (every type, as
    # without --types) run four, the laptop's eight, and all of those are busy.
    busy: dict[str, str] = {"senders-a": "email.send", "laptop": "report"}
    for name in hosts["senders"]:
        workers.register(conn, workers.WorkerInfo(name, 1, ("email.send",), host=name))
    for name in hosts["others"]:
        workers.register(conn, workers.WorkerInfo(name, 4, ("email.send", "report"), host=name))
        busy[name] = "report"
    workers.register(conn, workers.WorkerInfo("laptop", 8, ("email.send", "report"), host="laptop"))
    for worker, type_ in busy.items():
        (job_id,) = rota.enqueue_many(conn, [rota.NewJob(type_)])
        conn.execute(
            "UPDATE rota.job SET status = 'running', locked_by = %(w)s, attempts = 1,"
            " locked_until = now() + interval '1 hour' WHERE id = %(id)s",
            {"w": worker, "id": job_id},
        )
    kube_api.create(POOLS, worker_pool("senders", "senders", scaleDownStabilizationSeconds=1))

    pool = wait_for(
        lambda: (
            controller(kube_api, "senders") == 1
            and _status(kube_api, "senders", "decidedBy", "JobsRunning")
        ),
        what="down to the one busy pod of the target",
    )
    status = pool["status"]
    assert (status["busyReplicas"], status["minReplicasForRunningJobs"]) == (1, 1), status
    assert (status["runningJobs"], status["jobsPerReplica"]) == (1, 1), status
    costs = {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(kube.DELETION_COST)
        for p in kube_api.get(PODS)["items"]
    }
    assert costs == {"senders-a": "1", "senders-b": "0"} | dict.fromkeys(hosts["others"]), costs

    conn.execute(
        "UPDATE rota.job SET status = 'done', finished_at = now() WHERE type = 'email.send'"
    )
    pool = wait_for(
        lambda: (
            controller(kube_api, "senders") == 0
            and _status(kube_api, "senders", "decidedBy", "QueueEmpty")
        ),
        what="scaled to zero while the others stay busy",
    )
    status = pool["status"]
    assert (status["busyReplicas"], status["minReplicasForRunningJobs"]) == (0, 0), status
    assert _count(conn, "SELECT count(*) FROM rota.job WHERE status = 'running'") == 6
