"""The chart's hook Job: the console's signing key is made once, kept after, copied
from an earlier chart's Secret; an earlier chart's hook objects are adopted."""

from __future__ import annotations

import base64
import pathlib

import pytest
from kube_client import Api

from rota_operator import chart_hooks

SECRETS = "/api/v1/namespaces/default/secrets"


@pytest.fixture
def kubeconfig(kube_api: Api, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(kube_api.kubeconfig())
    monkeypatch.setenv("KUBECONFIG", str(path))


def key_of(api: Api, name: str) -> str:
    return str(api.get(f"{SECRETS}/{name}")["data"]["secret"])


def test_made_once_then_kept(kube_api: Api, kubeconfig: None) -> None:
    args = [
        "--signing-key",
        "rota-web-signing-key",
        "--namespace",
        "default",
        "--label",
        "app=rota",
    ]
    assert chart_hooks.main(args) == 0
    first = key_of(kube_api, "rota-web-signing-key")
    assert len(base64.b64decode(first)) >= 32
    secret = kube_api.get(f"{SECRETS}/rota-web-signing-key")
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert secret["metadata"]["labels"] == {"app": "rota"}
    assert chart_hooks.main(args) == 0  # an upgrade, a re-sync: the same key
    assert key_of(kube_api, "rota-web-signing-key") == first


def test_the_key_of_an_earlier_chart_is_copied(kube_api: Api, kubeconfig: None) -> None:
    old = base64.b64encode(b"the key sessions were signed with").decode()
    kube_api.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "rota-web-secret"},
            "data": {"secret": old},
        },
    )
    args = [
        "--signing-key=rota-web-signing-key",
        "--namespace=default",
        "--copy-from=rota-web-secret",
    ]
    assert chart_hooks.main(args) == 0
    assert key_of(kube_api, "rota-web-signing-key") == old


def test_an_earlier_chart_s_hook_objects_are_adopted(kube_api: Api, kubeconfig: None) -> None:
    pools = "/apis/rota.dev/v1/namespaces/default/workerpools"
    kube_api.create(
        pools,
        {
            "apiVersion": "rota.dev/v1",
            "kind": "WorkerPool",
            "metadata": {
                "name": "rota-worker",
                "annotations": {
                    "helm.sh/hook": "post-install,post-upgrade",
                    "helm.sh/hook-delete-policy": "before-hook-creation",
                },
            },
            "spec": {"scaleTargetRef": {"name": "w"}, "maxReplicas": 2},
        },
    )
    target = "rota.dev/v1/workerpools/default/rota-worker"
    missing = "kopf.dev/v1/clusterkopfpeerings//rota-operator"
    args = ["--namespace=default", "--release=rota", f"--adopt={target}", f"--adopt={missing}"]
    assert chart_hooks.main(args) == 0
    meta = kube_api.get(f"{pools}/rota-worker")["metadata"]
    assert meta["annotations"] == {
        "meta.helm.sh/release-name": "rota",
        "meta.helm.sh/release-namespace": "default",
    }
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "Helm"}
    assert chart_hooks.main(args) == 0  # owned already: left alone
