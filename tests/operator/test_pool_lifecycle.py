"""A WorkerPool carries no finalizer: deleting it never waits for the operator.

`helm uninstall` deletes the operator and the chart's WorkerPool at once; a
finalizer would keep the pool Terminating for ever. The pool's loop ends by
itself once its object is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from kopf.testing import KopfRunner
from kube_client import Api, wait_for
from prometheus_client import generate_latest
from test_workerpools import DEPLOYMENTS, POOLS, add_ready_jobs, deployment, worker_pool

from rota_operator import metrics


def series_of(pool: str) -> bool:
    return f'pool="default/{pool}"' in generate_latest(metrics.REGISTRY).decode()


def test_a_pool_has_no_finalizer_and_its_loop_ends_with_it(
    operator: KopfRunner, kube_api: Api, conn: psycopg.Connection[Any]
) -> None:
    kube_api.create(DEPLOYMENTS, deployment("gone", 1))
    add_ready_jobs(conn, 5, age_seconds=900, type_="email.send")
    kube_api.create(POOLS, worker_pool("gone", "gone"))
    wait_for(lambda: series_of("gone"), what="the pool polling")
    assert not kube_api.get(f"{POOLS}/gone")["metadata"].get("finalizers")

    kube_api.delete(f"{POOLS}/gone")
    assert kube_api.get(f"{POOLS}/gone") is None  # gone at once
    wait_for(lambda: not series_of("gone"), what="the loop ended")
    kube_api.patch(f"{DEPLOYMENTS}/gone/scale", {"spec": {"replicas": 1}})
    # Another pool polls meanwhile; when it has polled twice, the deleted one had its chance.
    kube_api.create(DEPLOYMENTS, deployment("witness", 0))
    kube_api.create(POOLS, worker_pool("witness", "witness", pollIntervalSeconds=1))
    wait_for(lambda: kube_api.get(f"{DEPLOYMENTS}/witness")["spec"]["replicas"] >= 4, what="polls")
    assert kube_api.get(f"{DEPLOYMENTS}/gone")["spec"]["replicas"] == 1


def test_a_pool_deleted_while_no_operator_runs_goes_at_once(
    run_operator: Callable[..., AbstractContextManager[KopfRunner]], kube_api: Api, db_url: str
) -> None:
    kube_api.create(DEPLOYMENTS, deployment("orphaned", 0))
    kube_api.create(POOLS, worker_pool("orphaned", "orphaned"))
    with run_operator(db_url):
        wait_for(lambda: (kube_api.get(f"{POOLS}/orphaned") or {}).get("status"), what="polled")
    kube_api.delete(f"{POOLS}/orphaned")
    assert kube_api.get(f"{POOLS}/orphaned") is None


def test_the_finalizer_of_an_earlier_version_is_taken_off(
    operator: KopfRunner, kube_api: Api
) -> None:
    kube_api.create(DEPLOYMENTS, deployment("older", 0))
    pool = worker_pool("older", "older")
    pool["metadata"]["finalizers"] = ["rota.dev/finalizer"]
    kube_api.create(POOLS, pool)
    wait_for(
        lambda: not kube_api.get(f"{POOLS}/older")["metadata"].get("finalizers"),
        what="the old finalizer removed",
    )
