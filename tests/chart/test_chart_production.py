"""Every documented value reaches what it is for: the knobs platform teams expect.

tests/chart/all-options.yaml sets every key of values.yaml (checked first), and
the render with it carries each component's knobs into its pods; values.schema.json
refuses typos in the new keys too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import ALL_OPTIONS, CHART, Render, run_helm

DIGEST = "sha256:" + "ab" * 32
# values.yaml section -> the app.kubernetes.io/component of its pods
COMPONENTS = {
    "operator": "operator",
    "scheduler": "scheduler",
    "worker": "worker",
    "exporter": "exporter",
    "web": "web",
    "migrations": "migrate",
}


def leaf_paths(node: Any, prefix: str = "") -> set[str]:
    """Dotted paths of values.yaml's keys, down to values that are not maps (or empty maps)."""
    paths = set()
    for key, child in node.items():
        path = f"{prefix}{key}"
        if isinstance(child, dict) and child and not path.endswith(("Annotations", "Labels")):
            paths |= leaf_paths(child, f"{path}.")
        else:
            paths.add(path)
    return paths


def test_all_options_sets_every_documented_value() -> None:
    documented = leaf_paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    given = yaml.safe_load(ALL_OPTIONS.read_text())

    def present(path: str) -> bool:
        node = given
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    assert sorted(p for p in documented if not present(p)) == []


def pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod templates by component (Deployments and the migration Job)."""
    found = {}
    for obj in objects:
        if obj["kind"] in {"Deployment", "Job"}:
            component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            if component in COMPONENTS.values():
                found[component] = obj["spec"]["template"]
    return found


@pytest.fixture(scope="module")
def everything(helm: Path) -> list[dict[str, Any]]:
    args = ["template", "rota", str(CHART), "--namespace", "rota", "--values", str(ALL_OPTIONS)]
    done = run_helm(helm, *args, "--api-versions", "rota.dev/v1/WorkerPool")
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("section", COMPONENTS)
def test_every_component_takes_every_knob(everything: list[dict[str, Any]], section: str) -> None:
    values = yaml.safe_load(ALL_OPTIONS.read_text())[section]
    template = pods(everything)[COMPONENTS[section]]
    spec = template["spec"]
    assert values["podAnnotations"].items() <= template["metadata"]["annotations"].items()
    assert values["podLabels"].items() <= template["metadata"]["labels"].items()
    assert spec["nodeSelector"] == values["nodeSelector"]
    assert spec.get("tolerations", []) == values["tolerations"]
    assert spec["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    assert values["extraVolumes"][0] in spec["volumes"]
    for container in spec["containers"]:
        assert values["extraEnv"][0] in container["env"], container["name"]
        assert values["extraVolumeMounts"][0] in container["volumeMounts"], container["name"]
        # TLS to the database through the mounted CA (sslmode=verify-full).
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PGSSLMODE"] == "verify-full"
        assert env["PGSSLROOTCERT"] == "/etc/rota/database-ca/ca.crt"
        mount = {"name": "database-ca", "mountPath": "/etc/rota/database-ca", "readOnly": True}
        assert mount in container["volumeMounts"]
    ca = next(v for v in spec["volumes"] if v["name"] == "database-ca")
    assert ca["secret"] == {
        "secretName": "postgres-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    accounts = {o["metadata"]["name"]: o for o in everything if o["kind"] == "ServiceAccount"}
    account = accounts[spec["serviceAccountName"]]
    assert (
        values["serviceAccount"]["annotations"].items()
        <= account["metadata"]["annotations"].items()
    )


@pytest.mark.parametrize("section", [s for s in COMPONENTS if s != "migrations"])
def test_every_long_running_component_has_a_budget_and_probes(
    everything: list[dict[str, Any]], section: str
) -> None:
    component = COMPONENTS[section]
    budgets = [
        o for o in everything
        if o["kind"] == "PodDisruptionBudget"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]  # fmt: skip
    (budget,) = budgets
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component
    for container in pods(everything)[component]["spec"]["containers"]:
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", container["name"]
        assert container["readinessProbe"]["httpGet"]["path"] in {"/healthz", "/readyz"}


def test_the_scheduler_and_reaper_are_probed_on_their_health_ports(
    everything: list[dict[str, Any]],
) -> None:
    containers = pods(everything)["scheduler"]["spec"]["containers"]
    assert [c["command"] for c in containers] == [
        ["rota", "scheduler", "--health-port=8181"],
        ["rota", "reaper", "--health-port=8182"],
    ]
    assert [c["readinessProbe"]["httpGet"]["path"] for c in containers] == ["/readyz"] * 2


def test_images_are_pinned_by_digest(everything: list[dict[str, Any]]) -> None:
    for component, template in pods(everything).items():
        for container in template["spec"]["containers"]:
            assert container["image"].endswith(f"@{DIGEST}"), (component, container["image"])


def test_a_1_20_cluster_gets_budgets_it_serves(render: Render, helm: Path) -> None:
    args = ["template", "rota", str(CHART), "--kube-version", "1.20.2"]
    done = run_helm(helm, *args, "--set", "operator.podDisruptionBudget.enabled=true")
    (budget,) = [
        o for o in yaml.safe_load_all(done.stdout) if o and o["kind"] == "PodDisruptionBudget"
    ]
    assert budget["apiVersion"] == "policy/v1beta1"


def test_the_operator_watches_its_release_namespace_unless_told(render: Render) -> None:
    def operator_env(sets: list[str]) -> dict[str, str]:
        (deployment,) = [
            o for o in render(sets=sets)
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")
        ]  # fmt: skip
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    default = operator_env([])
    assert (default["ROTA_NAMESPACES"], default["ROTA_INSTANCE"]) == ("rota", "")
    assert default["ROTA_PEERING_NAME"] == "rota-operator"
    assert operator_env(["operator.watchNamespaces={*}"])["ROTA_NAMESPACES"] == ""
    blue = operator_env(["operator.instance=blue", "operator.watchNamespaces={a,b}"])
    assert (blue["ROTA_NAMESPACES"], blue["ROTA_INSTANCE"]) == ("a,b", "blue")
    assert blue["ROTA_PEERING_NAME"] == "rota-operator-blue"


def test_the_instance_labels_the_release_s_pool_and_peering(
    everything: list[dict[str, Any]],
) -> None:
    owned = [o for o in everything if o["kind"] in {"WorkerPool", "KopfPeering"}]
    assert {o["kind"] for o in owned} == {"WorkerPool", "KopfPeering"}
    for obj in owned:
        assert obj["metadata"]["labels"]["rota.dev/instance"] == "blue"
    (pool,) = [o for o in owned if o["kind"] == "WorkerPool"]
    assert (pool["spec"]["paused"], pool["spec"]["jobsPerReplica"]) == (True, 5)


@pytest.mark.parametrize(
    "typo",
    [
        "worker.podDisruptionBudget.enabeld=true",
        "database.tls.sslmode=verify-fulll",
        "operator.instance=Blue",
        "worker.image.digest=latest",
        "scheduler.serviceAccount.annotation.x=y",
        "migrations.runtimeRole=no;drop",
        "web.topologySpreadConstraint[0].maxSkew=1",
    ],
)
def test_typos_in_the_new_keys_are_refused(helm: Path, typo: str) -> None:
    done = run_helm(helm, "template", "rota", str(CHART), "--set", typo)
    assert done.returncode != 0, typo


def test_the_hooks_job_takes_the_operator_s_pod_settings(
    everything: list[dict[str, Any]],
) -> None:
    """It runs in the operator's image beside it: an injected sidecar, a proxy or a
    CA bundle the operator needs, the hook Job needs as well."""
    values = yaml.safe_load(ALL_OPTIONS.read_text())["operator"]
    (job,) = [
        o for o in everything
        if o["kind"] == "Job" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "hooks"
    ]  # fmt: skip
    template = job["spec"]["template"]
    spec = template["spec"]
    assert values["podAnnotations"].items() <= template["metadata"]["annotations"].items()
    assert values["podLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "hooks"
    assert spec["nodeSelector"] == values["nodeSelector"]
    assert spec["tolerations"] == values["tolerations"]
    assert spec["affinity"] == values["affinity"]
    assert values["extraVolumes"][0] in spec["volumes"]
    (container,) = spec["containers"]
    assert container["env"] == values["extraEnv"]
    assert values["extraVolumeMounts"][0] in container["volumeMounts"]


def test_the_hooks_get_a_role_only_where_they_have_rules(render: Render) -> None:
    """Peering in other namespaces, nothing to do in the release's: no empty Role there."""
    objects = render(sets=["operator.peering.enabled=true", "operator.watchNamespaces={team-a}"])
    hooks = [
        o for o in objects
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "hooks"
    ]  # fmt: skip
    roles = {o["metadata"]["namespace"]: o for o in hooks if o["kind"] == "Role"}
    bindings = {o["metadata"]["namespace"] for o in hooks if o["kind"] == "RoleBinding"}
    assert sorted(roles) == sorted(bindings) == ["team-a"]
    for role in roles.values():
        assert role["rules"], role["metadata"]
