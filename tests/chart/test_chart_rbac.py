"""The operator's RBAC grants exactly what its code and kopf use, nothing more.

The expected permissions are derived from the operator's source: the resources
its kopf handlers serve, and every Kubernetes API method it calls (mapped below).
A new API call in the operator fails this test until it is mapped here and
granted, with a comment, in charts/rota/templates/operator/rbac.yaml.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest
from chart_support import ALL_OPTIONS, CHART, ROOT, Render

OPERATOR = ROOT / "operator" / "rota_operator"
Grant = tuple[str, str, str]  # (apiGroup, resource, verb)

# kubernetes client methods the operator calls -> the permission each needs.
# "{custom}" stands for every custom resource the operator serves.
API_CALLS: dict[str, list[Grant]] = {
    "read_namespaced_deployment_scale": [("apps", "deployments/scale", "get")],
    "read_namespaced_deployment": [("apps", "deployments", "get")],
    "patch_namespaced_deployment_scale": [("apps", "deployments/scale", "patch")],
    "patch_namespaced_custom_object_status": [("{group}", "{custom}/status", "patch")],
    "get_namespaced_custom_object": [("{group}", "{custom}", "get")],
    "create_namespaced_event": [("", "events", "create")],
    "list_namespaced_pod": [("", "pods", "list")],
    "patch_namespaced_pod": [("", "pods", "patch")],
    # The wait for peering lists CRDs and kopf's peering objects: kopf's own
    # grants (below) already cover both. A WorkerPool lists the other scalers
    # of its namespace (pool_inputs.SCALERS): WorkerPools are covered by kopf's.
    "list_cluster_custom_object": [],
    "list_namespaced_custom_object": [
        ("autoscaling", "horizontalpodautoscalers", "list"),
        ("keda.sh", "scaledobjects", "list"),
    ],
}
# kopf itself: list+watch to serve a resource, patch for finalizers and its
# annotations, events for handler failures.
KOPF_PER_RESOURCE = ("list", "watch", "patch")
KOPF_NAMESPACED: list[Grant] = [("", "events", "create")]
KOPF_CLUSTER: list[Grant] = [
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
]
KOPF_NAMESPACE_LOOKUP: list[Grant] = [("", "namespaces", "list"), ("", "namespaces", "watch")]


def _served_resources() -> set[tuple[str, str]]:
    """(group, plural) of every resource a kopf handler in the operator serves."""
    found = set()
    for path in OPERATOR.glob("*.py"):
        for group, _version, plural in re.findall(
            r'\(\s*"([a-z0-9.-]+\.[a-z]+)",\s*"(v[0-9a-z]+)",\s*"([a-z]+)"\s*\)', path.read_text()
        ):
            found.add((group, plural))
    return found


def _api_calls() -> set[str]:
    """Names of the kubernetes client methods called on the operator's API objects."""
    calls = set()
    for path in OPERATOR.glob("*.py"):
        if path.name == "chart_hooks.py":
            continue  # a hook Job with a Role of its own (test_chart_web.py)
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in {"apps", "core", "custom"}
                and not node.attr.startswith("_")
            ):
                calls.add(node.attr)
    return calls


def expected(namespaced: bool, peering: bool) -> tuple[set[Grant], set[Grant]]:
    """(cluster-wide grants, per-namespace grants) the operator needs."""
    served = _served_resources()
    assert served, "no kopf handlers found in the operator"
    unknown = _api_calls() - set(API_CALLS)
    assert not unknown, f"map these API calls in API_CALLS and grant them in the chart: {unknown}"
    per_ns: set[Grant] = set(KOPF_NAMESPACED)
    for group, plural in served:
        per_ns |= {(group, plural, verb) for verb in KOPF_PER_RESOURCE}
    for call in _api_calls():
        for group, resource, verb in API_CALLS[call]:
            if "{custom}" in resource:
                per_ns |= {(g, resource.format(custom=p), verb) for g, p in served}
            else:
                per_ns.add((group, resource, verb))
    cluster: set[Grant] = set(KOPF_CLUSTER)
    if namespaced:
        cluster |= set(KOPF_NAMESPACE_LOOKUP)
        if peering:
            per_ns |= {("kopf.dev", "kopfpeerings", v) for v in KOPF_PER_RESOURCE}
        return cluster, per_ns
    if peering:
        cluster |= {("kopf.dev", "clusterkopfpeerings", v) for v in KOPF_PER_RESOURCE}
    return cluster | per_ns, set()


def _grants(role: dict[str, Any]) -> set[Grant]:
    grants = set()
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants |= {(group, resource, verb) for verb in rule["verbs"]}
    return grants


SCENARIOS = {
    "cluster": ["operator.watchNamespaces={*}"],
    "cluster-peering": ["operator.watchNamespaces={*}", "operator.peering.enabled=true"],
    "namespaced-release": [],
    "namespaced-release-peering": ["operator.peering.enabled=true"],
    "namespaced": ["operator.watchNamespaces={team-a,team-b}"],
    "namespaced-peering": [
        "operator.watchNamespaces={team-a,team-b}",
        "operator.peering.enabled=true",
    ],
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rbac_grants_exactly_what_the_operator_uses(render: Render, scenario: str) -> None:
    sets = SCENARIOS[scenario]
    # The chart's hook Job has rights of its own (test_chart_web.py), not the operator's.
    objects = [
        o
        for o in render(sets=sets)
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "hooks"
    ]
    namespaced = "namespaced" in scenario
    want_cluster, want_ns = expected(namespaced, peering="peering" in scenario)
    (cluster_role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    assert _grants(cluster_role) == want_cluster
    roles = [o for o in objects if o["kind"] == "Role"]
    # No watchNamespaces: the release's own namespace.
    watched = ["team-a", "team-b"] if "team-a" in str(sets) else ["rota"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == (watched if namespaced else [])
    for role in roles:
        assert _grants(role) == want_ns


def test_bindings_name_the_operator_service_account(render: Render) -> None:
    objects = render(sets=SCENARIOS["namespaced"])
    (account,) = [
        o
        for o in objects
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-operator")
    ]
    bindings = [o for o in objects if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}]
    assert len(bindings) == 3
    for binding in bindings:
        (subject,) = binding["subjects"]
        assert subject["name"] == account["metadata"]["name"]
        assert subject["namespace"] == "rota"


def test_every_rule_says_why() -> None:
    lines = (CHART / "templates" / "operator" / "rbac.yaml").read_text().splitlines()
    for number, line in enumerate(lines):
        if line.lstrip().startswith("- apiGroups:"):
            above = lines[number - 1].strip()
            assert above.startswith("#"), f"rbac.yaml line {number + 1} has no comment above it"


def test_workers_get_no_api_token(render: Render) -> None:
    for obj in render(sets=["worker.enabled=true"]):
        name = obj["metadata"]["name"]
        if obj["kind"] == "Deployment" and not name.endswith("-operator"):
            assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, name


def _watched(objects: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(ROTA_NAMESPACES of the operator, namespaces of its Roles)."""
    (deployment,) = [
        o for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["labels"]["app.kubernetes.io/component"]
        == "operator"
    ]  # fmt: skip
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    roles = [
        o["metadata"]["namespace"] for o in objects
        if o["kind"] == "Role" and o["metadata"]["labels"]["app.kubernetes.io/component"]
        == "operator"
    ]  # fmt: skip
    return env["ROTA_NAMESPACES"].split(",") if env["ROTA_NAMESPACES"] else [], sorted(roles)


def test_the_operator_watches_the_namespace_of_the_release_s_own_pool(render: Render) -> None:
    """The chart's WorkerPool lives in the release namespace: the operator must see it."""
    listed = ["operator.watchNamespaces={team-a,team-b}"]
    names, roles = _watched(render(sets=[*listed, "worker.enabled=true"]))
    assert names == ["team-a", "team-b", "rota"]
    assert roles == ["rota", "team-a", "team-b"]
    all_options = render(values=[ALL_OPTIONS])
    assert _watched(all_options) == (["team-a", "team-b", "rota"], ["rota", "team-a", "team-b"])
    # Without the chart's pool nothing of the release needs the operator there.
    for sets in ([], ["worker.enabled=true", "worker.pool.enabled=false"]):
        assert _watched(render(sets=[*listed, *sets])) == (
            ["team-a", "team-b"],
            ["team-a", "team-b"],
        )
    # Listed already: once; every namespace: no Role at all.
    listed_too = render(sets=["operator.watchNamespaces={rota,team-a}", "worker.enabled=true"])
    assert _watched(listed_too) == (["rota", "team-a"], ["rota", "team-a"])
    everywhere = render(sets=["operator.watchNamespaces={*}", "worker.enabled=true"])
    assert _watched(everywhere) == ([], [])
