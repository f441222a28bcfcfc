"""web.enabled: the console's Deployment, Service, token Secret and optional Ingress."""

from __future__ import annotations

import base64
from typing import Any

from chart_support import ALL_OPTIONS, Render


def _by_kind(objects: list[dict[str, Any]], component: str = "web") -> dict[str, dict[str, Any]]:
    """The console's objects by kind; its signing-key Secret under "SigningSecret"."""
    found = {}
    for o in objects:
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") != component:
            continue
        signing = o["kind"] == "Secret" and o["metadata"]["name"].endswith("-web-secret")
        found["SigningSecret" if signing else o["kind"]] = o
    return found


def _env(container: dict[str, Any], name: str) -> dict[str, Any]:
    (env,) = [e for e in container["env"] if e["name"] == name]
    return env


def test_the_console_is_off_by_default(render: Render) -> None:
    assert _by_kind(render()) == {}


def test_enabled_renders_a_deployment_and_a_service_without_ingress(render: Render) -> None:
    found = _by_kind(render(sets=["web.enabled=true"]))
    assert set(found) == {"Deployment", "Service", "ServiceAccount"}
    (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["rota", "web", "--host=0.0.0.0", "--port=8080"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "ROTA_WEB_TOKEN" not in {e["name"] for e in container["env"]}
    assert found["Service"]["spec"]["ports"][0]["targetPort"] == "http"


def test_the_token_comes_from_a_secret(render: Render) -> None:
    found = _by_kind(render(sets=["web.enabled=true", "web.token.existingSecret=console-token"]))
    assert "Secret" not in found
    (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in container["env"] if e["name"] == "ROTA_WEB_TOKEN"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "console-token", "key": "token"}


def test_a_token_value_is_kept_in_a_secret_of_the_chart(render: Render) -> None:
    found = _by_kind(render(sets=["web.enabled=true", "web.token.value=not-a-real-token"]))
    assert found["Secret"]["stringData"] == {"token": "not-a-real-token"}
    (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in container["env"] if e["name"] == "ROTA_WEB_TOKEN"]
    assert env["valueFrom"]["secretKeyRef"]["name"] == found["Secret"]["metadata"]["name"]


def test_all_options_render_the_ingress_and_the_proxy_flags(render: Render) -> None:
    found = _by_kind(render(values=[ALL_OPTIONS]))
    assert set(found) == {
        "Deployment", "Service", "Ingress", "ServiceAccount", "PodDisruptionBudget"
    }  # fmt: skip
    (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][2:] == [
        "--host=0.0.0.0", "--port=8088", "--read-only", "--proxy-header=X-Forwarded-User",
        "--proxy-groups-header=X-Forwarded-Groups", "--proxy-from=10.0.0.0/8", "--operator=ann",
        "--operator-group=oncall", "--forwarded-from=10.0.0.0/8",
    ]  # fmt: skip
    secret = _env(container, "ROTA_WEB_SECRET")["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "console-signing", "key": "signing-key"}
    (env,) = [e for e in container["env"] if e["name"] == "ROTA_WEB_TOKEN"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "console-token", "key": "key"}
    rule = found["Ingress"]["spec"]["rules"][0]
    assert rule["host"] == "rota.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": found["Service"]["metadata"]["name"], "port": {"name": "http"}}


def test_every_replica_signs_with_one_key_made_once_by_a_hook(render: Render) -> None:
    """No `lookup`: the rendered objects are the same at every render (GitOps), and the
    chart's hook Job makes the key's Secret once (tests/operator/test_chart_hooks.py)."""
    first = render(sets=["web.enabled=true", "web.replicas=3"])
    assert first == render(sets=["web.enabled=true", "web.replicas=3"])
    found = _by_kind(first)
    assert "SigningSecret" not in found and "Secret" not in found
    hooks = _by_kind(first, "hooks")
    job = hooks["Job"]
    (maker,) = job["spec"]["template"]["spec"]["containers"]
    assert maker["command"] == ["python", "-m", "rota_operator.chart_hooks"]
    assert "--signing-key=rota-web-signing-key" in maker["args"]
    assert "--copy-from=rota-web-secret" in maker["args"]  # the key of an earlier chart
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (rule, create) = hooks["Role"]["rules"]
    assert rule["resourceNames"] == ["rota-web-signing-key", "rota-web-secret"]
    assert (rule["verbs"], create["verbs"]) == (["get"], ["create"])
    (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
    ref = _env(container, "ROTA_WEB_SECRET")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "rota-web-signing-key", "key": "secret"}


def test_an_earlier_chart_s_hook_objects_are_handed_to_the_release(render: Render) -> None:
    objects = render(sets=["worker.enabled=true", "operator.peering.enabled=true"])
    hooks = _by_kind(objects, "hooks")
    (container,) = hooks["Job"]["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--adopt")] == [
        "--adopt=rota.dev/v1/workerpools/rota/rota-worker",
        "--adopt=kopf.dev/v1/kopfpeerings/rota/rota-operator",
    ]
    names = {r["resources"][0]: r["resourceNames"] for r in hooks["Role"]["rules"]}
    assert names == {"workerpools": ["rota-worker"], "kopfpeerings": ["rota-operator"]}
    assert not _by_kind(render(), "hooks")  # nothing to make, nothing to hand over


def test_a_signing_key_value_is_kept_in_a_secret_of_the_chart(render: Render) -> None:
    found = _by_kind(render(sets=["web.enabled=true", "web.secret.value=sealed-in-git"]))
    signing = found["SigningSecret"]
    assert base64.b64decode(signing["data"]["secret"]) == b"sealed-in-git"
    assert not any(k.startswith("KeyMaker") for k in found)
