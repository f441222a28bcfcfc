"""Without ROTA_STANDALONE and without peering, `rota-operator` says why it waits, and goes on.

kopf keeps an operator with mandatory peering paused until the kopf.dev CRDs
and the peering object exist, and says nothing at the default level; the
operator logs a warning at start and then periodically, with the ways out.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kube_client import CRDS, Api, EmulatorThread, wait_for

from rota import schedule_store as schedules
from rota_operator import kube
from rota_operator.__main__ import peering_wait_reason
from rota_operator.settings import Settings

SCRIPT = pathlib.Path(sys.executable).parent / "rota-operator"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture
def bare_api() -> Iterator[Api]:
    """An emulator with Rota's CRDs but not kopf's peering CRDs."""
    server = EmulatorThread()
    try:
        api = Api(server.url)
        for path in sorted(CRDS.glob("*.yaml")):
            for crd in yaml.safe_load_all(path.read_text()):
                api.create(CRD_PATH, crd)
        yield api
    finally:
        server.close()


def install_peering(api: Api, namespace: str = "") -> None:
    for path in sorted(CRDS.glob("kopf/*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            api.create(CRD_PATH, crd)
    meta = {"name": "rota-operator"}
    if namespace:
        path = f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings"
        body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": meta}
    else:
        path = "/apis/kopf.dev/v1/clusterkopfpeerings"
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": meta}
    api.create(path, body)


def client(api: Api, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> kube.Kube:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    return kube.Kube(kube.load_client())


@pytest.mark.parametrize("namespaces", [(), ("default",)], ids=["clusterwide", "namespaced"])
def test_the_reason_names_what_is_missing(
    bare_api: Api,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    namespaces: tuple[str, ...],
) -> None:
    settings = Settings(namespaces=namespaces)
    api = client(bare_api, tmp_path, monkeypatch)
    plural = "kopfpeerings" if namespaces else "clusterkopfpeerings"
    assert peering_wait_reason(api, settings) == f"the CRD {plural}.kopf.dev is not installed"

    for path in sorted(CRDS.glob("kopf/*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            bare_api.create(CRD_PATH, crd)
    kind = "KopfPeering" if namespaces else "ClusterKopfPeering"
    where = " in namespace default" if namespaces else ""
    assert peering_wait_reason(api, settings) == (
        f"there is no {kind} named 'rota-operator'{where}"
    )

    meta = {"name": "rota-operator"}
    if namespaces:
        body = {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": meta}
        bare_api.create("/apis/kopf.dev/v1/namespaces/default/kopfpeerings", body)
    else:
        body = {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": meta}
        bare_api.create("/apis/kopf.dev/v1/clusterkopfpeerings", body)
    assert peering_wait_reason(api, settings) is None


def test_the_operator_says_it_waits_for_peering_then_goes_on_once_it_exists(
    bare_api: Api, db_url: str, tmp_path: pathlib.Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(bare_api.kubeconfig())
    env: dict[str, Any] = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "ROTA_DATABASE_URL": db_url,
        "ROTA_METRICS_PORT": "-1",
        "ROTA_STANDALONE": "false",
        "ROTA_NAMESPACES": "",
        "ROTA_PEERING_WAIT_LOG_SECONDS": "0.5",
    }
    log_path = tmp_path / "operator.log"
    log = log_path.open("w")
    process = subprocess.Popen([str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # At start, and again while it waits: why, and the ways out.
        wait_for(
            lambda: log_path.read_text().count("The operator is paused") >= 3,
            timeout=60,
            what="three warnings about the missing peering",
        )
        text = log_path.read_text()
        assert "the CRD clusterkopfpeerings.kopf.dev is not installed" in text
        assert "ROTA_STANDALONE=true" in text and "crds/kopf/" in text
        assert "operator.peering.enabled=true" in text

        schedule = {
            "apiVersion": "rota.dev/v1",
            "kind": "JobSchedule",
            "metadata": {"name": "waiting"},
            "spec": {"jobType": "t", "schedule": "@daily"},
        }
        bare_api.create("/apis/rota.dev/v1/namespaces/default/jobschedules", schedule)
        install_peering(bare_api)
        wait_for(
            lambda: "Peering found after" in log_path.read_text(),
            timeout=60,
            what="the operator to see the peering",
        )
        wait_for(lambda: schedules.get(db_url, "default/waiting"), timeout=60, what="the row")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        log.close()
    assert code == 0, log_path.read_text()


def test_standalone_says_so_and_never_warns_about_peering(
    bare_api: Api, db_url: str, tmp_path: pathlib.Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(bare_api.kubeconfig())
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "ROTA_DATABASE_URL": db_url,
        "ROTA_METRICS_PORT": "-1",
        "ROTA_STANDALONE": "true",
        "ROTA_PEERING_WAIT_LOG_SECONDS": "0.5",
    }
    log_path = tmp_path / "operator.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            schedule = {
                "apiVersion": "rota.dev/v1",
                "kind": "JobSchedule",
                "metadata": {"name": "alone"},
                "spec": {"jobType": "t", "schedule": "@daily"},
            }
            bare_api.create("/apis/rota.dev/v1/namespaces/default/jobschedules", schedule)
            wait_for(lambda: schedules.get(db_url, "default/alone"), timeout=60, what="the row")
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
    text = log_path.read_text()
    assert code == 0, text
    assert "The operator is paused" not in text
