"""`rota-operator`, the console script, runs the same operator and stops on SIGTERM."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest
from kube_client import Api, wait_for

from rota import schedule_store as schedules

SCRIPT = pathlib.Path(sys.executable).parent / "rota-operator"


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            {"ROTA_STANDALONE": "true", "ROTA_NAMESPACES": "default"}, id="standalone-namespaced"
        ),
        pytest.param({"ROTA_STANDALONE": "false", "ROTA_NAMESPACES": ""}, id="peering-clusterwide"),
    ],
)
def test_runs_until_sigterm(
    kube_api: Api, db_url: str, tmp_path: pathlib.Path, mode: dict[str, str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube_api.kubeconfig())
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "rota-operator"},
    }
    kube_api.create("/apis/kopf.dev/v1/clusterkopfpeerings", peering)
    env: dict[str, Any] = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "ROTA_DATABASE_URL": db_url,
        "ROTA_METRICS_PORT": "0",
        **mode,
    }
    log = (tmp_path / "operator.log").open("w+")
    process = subprocess.Popen([str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        schedule = {
            "apiVersion": "rota.dev/v1",
            "kind": "JobSchedule",
            "metadata": {"name": "scripted"},
            "spec": {"jobType": "t", "schedule": "@daily"},
        }
        kube_api.create("/apis/rota.dev/v1/namespaces/default/jobschedules", schedule)
        wait_for(lambda: schedules.get(db_url, "default/scripted"), timeout=30, what="the row")
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    log.seek(0)
    assert code == 0, log.read()
