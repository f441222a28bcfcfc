"""The chart lints clean, renders valid Kubernetes objects and rejects typos.

Built-in kinds are validated offline by kubernetes-validate (bundled OpenAPI
schemas, strict: unknown fields fail). Our own kinds are validated against the
CRDs in crds/. The Prometheus operator's and kopf's kinds have no schema here and
are skipped by name, on purpose.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_support import ALL_OPTIONS, CHART, ROOT, Render, run_helm, template_text

KUBERNETES_VALIDATE = ROOT / ".venv" / "bin" / "kubernetes-validate"
# The oldest schemas kubernetes-validate ships and the newest tested. The chart's
# lower end (Chart.yaml kubeVersion, 1.20) is checked on a real API server by
# `make test-cluster` (tests/cluster/).
KUBE_VERSIONS = ["1.25.0", "1.33.0"]
OUR_KINDS = {"WorkerPool", "JobSchedule"}
# Kinds whose schemas ship with other projects (Prometheus operator, kopf), not with
# kubernetes-validate or this repository: only their rendering is checked here.
FOREIGN_KINDS = {
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
    "KopfPeering",
    "ClusterKopfPeering",
}
VALUE_SETS = {
    "defaults": {},
    "all-options": {"values": [ALL_OPTIONS]},
    "worker-and-monitoring": {
        "sets": ["worker.enabled=true", "metrics.serviceMonitor.enabled=true"],
        "api_versions": ["monitoring.coreos.com/v1/PrometheusRule"],
    },
    "cluster-peering": {"sets": ["operator.peering.enabled=true", "operator.replicas=2"]},
    "without-operator": {
        "sets": [
            *(
                WITHOUT_OPERATOR := [
                    "operator.enabled=false",
                    "exporter.enabled=true",
                    "worker.enabled=true",
                    "worker.pool.enabled=false",
                    "metrics.podMonitor.enabled=true",
                ]
            )
        ]
    },
}


def test_helm_lint_strict(helm: Path) -> None:
    for extra in ([], ["--values", str(ALL_OPTIONS)]):
        done = run_helm(helm, "lint", "--strict", str(CHART), *extra)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendered_objects_pass_kubernetes_validate(helm: Path, name: str) -> None:
    if not KUBERNETES_VALIDATE.exists():
        pytest.skip("kubernetes-validate is not installed in .venv (a dev dependency)")
    options = VALUE_SETS[name]
    text = template_text(helm, **options)
    for version in KUBE_VERSIONS:
        command = [str(KUBERNETES_VALIDATE), "--strict", "--quiet", "-k", version, "-"]
        done = subprocess.run(command, input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        unknown = set(re.findall(r"Couldn't find schema for kind (\w+)", done.stdout))
        assert unknown <= OUR_KINDS | FOREIGN_KINDS, f"kinds nobody validates: {unknown}"
        assert "ERROR" not in done.stdout, done.stdout


def _crd_schema(kind: str) -> dict[str, Any]:
    for path in (ROOT / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = crd["spec"]["versions"]
            return version["schema"]["openAPIV3Schema"]
    raise AssertionError(f"no CRD for {kind} in crds/")


def test_our_kinds_match_their_crds(render: Render) -> None:
    rendered = [o for o in render(values=[ALL_OPTIONS]) if o["kind"] in OUR_KINDS]
    assert rendered, "the all-options render should hold a WorkerPool"
    for obj in rendered:
        validator = jsonschema.Draft4Validator(_crd_schema(obj["kind"]))
        assert [e.message for e in validator.iter_errors(obj)] == []


def test_the_workerpool_targets_the_worker_deployment(render: Render) -> None:
    objects = render(values=[ALL_OPTIONS])
    (pool,) = [o for o in objects if o["kind"] == "WorkerPool"]
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    target = deployments[pool["spec"]["scaleTargetRef"]["name"]]
    assert "replicas" not in target["spec"], "the operator, not helm, owns the replicas"
    # Before its CRD is served (a first install): a post-install hook the next upgrade adopts.
    notes = pool["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "post-install"
    assert (notes["meta.helm.sh/release-name"], notes["meta.helm.sh/release-namespace"]) == (
        "rota",
        "rota",
    )
    # Once served (every upgrade): an ordinary object of the release.
    served = render(values=[ALL_OPTIONS], api_versions=["rota.dev/v1/WorkerPool"])
    (pool,) = [o for o in served if o["kind"] == "WorkerPool"]
    assert "annotations" not in pool["metadata"]


def test_unknown_values_are_rejected(helm: Path) -> None:
    for typo in ["worker.enabeld=true", "operator.image.tga=1", "metrics.dashbord.enabled=true"]:
        done = run_helm(helm, "template", "rota", str(CHART), "--set", typo)
        assert done.returncode != 0 and "not allowed" in done.stderr, typo


def test_schema_forbids_unknown_keys_everywhere() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    open_objects = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "properties" in node and node.get("additionalProperties") is not False:
                open_objects.append(path)
            for key, child in node.items():
                walk(child, f"{path}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}/{i}")

    walk(schema, "#")
    assert open_objects == []


def _value_paths(node: Any, prefix: str = "") -> list[str]:
    paths = []
    if isinstance(node, dict):
        for key, child in node.items():
            paths.append(f"{prefix}{key}")
            if isinstance(child, dict) and child:
                paths += _value_paths(child, f"{prefix}{key}.")
    return paths


def test_every_default_value_is_in_the_schema() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    defs = schema["$defs"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in _value_paths(values):
        node = schema
        for part in path.split("."):
            if "$ref" in node:
                node = defs[node["$ref"].rsplit("/", 1)[1]]
            props = node.get("properties")
            extra = node.get("additionalProperties")
            assert (props is not None and part in props) or isinstance(extra, dict), path
            node = props[part] if props and part in props else extra


def test_every_key_in_values_yaml_has_a_comment_above_it() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for number, line in enumerate(lines):
        if re.match(r"^\s*[A-Za-z_][\w.-]*:", line):
            above = lines[number - 1].strip() if number else ""
            if not above.startswith("#"):
                missing.append(f"line {number + 1}: {line.strip()}")
    assert missing == []


def test_every_container_is_locked_down(render: Render) -> None:
    for obj in render(values=[ALL_OPTIONS]):
        pod = _pod_spec(obj)
        if pod is None:
            continue
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"], container["name"]


def test_long_running_containers_have_probes_on_the_metrics_port(render: Render) -> None:
    objects = render(values=[ALL_OPTIONS])
    probed = {"operator": "/healthz", "worker": "/readyz", "exporter": "/healthz"}
    for obj in objects:
        component = obj["metadata"]["labels"].get("app.kubernetes.io/component")
        if obj["kind"] != "Deployment" or component not in probed:
            continue
        (container,) = _pod_spec(obj)["containers"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"]["path"] == probed[component]
        assert container["ports"][0]["name"] == "metrics"


def test_a_worker_has_its_startup_wait_before_a_probe_may_kill_it(render: Render) -> None:
    # `rota worker` serves /healthz only once it has started: it waits up to
    # --startup-wait (60 s) for its database, then exits 1 saying why. The
    # liveness probe killed it at 50 s, with no reason in its log.
    [worker] = [
        obj for obj in render(sets=["worker.enabled=true"])
        if obj["kind"] == "Deployment"
        and obj["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    ]  # fmt: skip
    (container,) = _pod_spec(worker)["containers"]
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert startup["periodSeconds"] * startup["failureThreshold"] > 60
    assert "initialDelaySeconds" not in container["livenessProbe"]


def test_a_longer_startup_wait_moves_the_startup_probe_with_it(render: Render) -> None:
    # A worker told to wait longer for its database than the probe's window was
    # restarted by its probe before it could exit with its reason.
    for wait, args in [(None, "--startup-wait=60"), (300, "--startup-wait=300")]:
        sets = ["worker.enabled=true"]
        if wait is not None:
            sets.append(f"worker.startupWaitSeconds={wait}")
        [worker] = [
            obj for obj in render(sets=sets)
            if obj["kind"] == "Deployment"
            and obj["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
        ]  # fmt: skip
        (container,) = _pod_spec(worker)["containers"]
        assert args in container["args"]
        startup = container["startupProbe"]
        window = startup["periodSeconds"] * startup["failureThreshold"]
        assert (wait or 60) + 20 <= window <= (wait or 60) + 40


def test_database_url_comes_from_the_secret(render: Render) -> None:
    """Every component reads the runtime URL; the migrations the owner's, when set."""
    for values, secret, owner in [
        ([], "rota-database", "rota-database"),
        ([ALL_OPTIONS], "rota-all-database", "rota-owner"),
    ]:
        for obj in render(values=values):
            pod = _pod_spec(obj)
            for container in (pod or {}).get("containers", []):
                if container["name"] == "chart-hooks":
                    # The console's key maker needs no database: only operator.extraEnv.
                    names = {e["name"] for e in container.get("env", [])}
                    assert "ROTA_DATABASE_URL" not in names
                    assert not {n for n in names if n.startswith("PG")}
                    continue
                (env,) = [e for e in container["env"] if e["name"] == "ROTA_DATABASE_URL"]
                wanted = owner if container["name"] == "migrate" else secret
                assert env["valueFrom"]["secretKeyRef"]["name"] == wanted, container["name"]


def test_migrations_run_before_install_and_upgrade(render: Render) -> None:
    objects = render(values=[ALL_OPTIONS])
    (job,) = [o for o in objects if o["kind"] == "Job" and "migrate" in o["metadata"]["name"]]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["rota", "migrate"]
    assert container["args"] == ["--key-index", "partial", "--grant", "rota_worker"]
    url = next(e for e in container["env"] if e["name"] == "ROTA_DATABASE_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "rota-owner", "key": "owner-url"}
    (default_job,) = [o for o in render() if o["kind"] == "Job"]
    assert "args" not in default_job["spec"]["template"]["spec"]["containers"][0]
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    secret_weight = int(secret["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert secret_weight < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])


def test_prometheus_rule_follows_the_cluster_in_auto_mode(render: Render) -> None:
    assert not [o for o in render() if o["kind"] == "PrometheusRule"]
    with_crds = render(api_versions=["monitoring.coreos.com/v1/PrometheusRule"])
    (rule,) = [o for o in with_crds if o["kind"] == "PrometheusRule"]
    assert isinstance(rule["spec"]["groups"], list)


def test_dashboard_configmap_carries_the_dashboard(render: Render) -> None:
    (config,) = [o for o in render(values=[ALL_OPTIONS]) if o["kind"] == "ConfigMap"]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = yaml.safe_load((CHART / "files" / "dashboard.json").read_text())
    assert yaml.safe_load(config["data"]["rota.json"]) == shipped


def test_more_than_one_operator_needs_peering(helm: Path) -> None:
    done = run_helm(helm, "template", "rota", str(CHART), "--set", "operator.replicas=2")
    assert done.returncode != 0 and "peering" in done.stderr


def test_peering_objects_are_ordinary_once_their_crds_are_served(render: Render) -> None:
    objects = render(values=[ALL_OPTIONS])
    peerings = [o for o in objects if o["kind"] == "KopfPeering"]
    # The release's namespace too: the operator watches it for the chart's WorkerPool.
    assert {o["metadata"]["namespace"] for o in peerings} == {"team-a", "team-b", "rota"}
    for peering in peerings:
        assert peering["metadata"]["annotations"]["helm.sh/hook"] == "post-install"
    served = ["kopf.dev/v1/ClusterKopfPeering", "kopf.dev/v1/KopfPeering"]
    for sets, kind in (
        (["operator.watchNamespaces={*}"], "ClusterKopfPeering"),
        ([], "KopfPeering"),
    ):
        objects = render(sets=["operator.peering.enabled=true", *sets], api_versions=served)
        (peering,) = [o for o in objects if o["kind"] == kind]
        assert "annotations" not in peering["metadata"], peering
        assert peering["metadata"]["name"] == "rota-operator"


def test_every_operator_replica_draws_its_own_peering_priority(helm: Path, render: Render) -> None:
    (operator,) = [
        o
        for o in render(values=[ALL_OPTIONS])
        if o["kind"] == "Deployment"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    env = {e["name"] for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "ROTA_PEERING_PRIORITY" not in env and "ROTA_PEERING_NAME" in env
    pinned = "operator.extraEnv[0].name=ROTA_PEERING_PRIORITY,operator.extraEnv[0].value=7"
    done = run_helm(
        helm, "template", "rota", str(CHART), "-f", str(ALL_OPTIONS), "--set-string", pinned
    )
    assert done.returncode != 0 and "ROTA_PEERING_PRIORITY" in done.stderr


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in {"Deployment", "Job"}:
        spec: dict[str, Any] = obj["spec"]["template"]["spec"]
        return spec
    return None


def _by_component(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in objects
        if o["kind"] == kind
    }


def test_without_the_operator_an_exporter_serves_the_queue_metrics(render: Render) -> None:
    objects = render(sets=WITHOUT_OPERATOR)
    deployments = _by_component(objects, "Deployment")
    assert "operator" not in deployments
    assert not [o for o in objects if o["kind"] in {"WorkerPool", "ClusterRole", "Role"}]
    (exporter,) = _pod_spec(deployments["exporter"])["containers"]
    assert exporter["command"] == ["rota", "exporter"]
    assert exporter["args"] == ["--port=9091"]
    assert "exporter" in _by_component(objects, "Service")
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    selected = monitor["spec"]["selector"]["matchExpressions"][0]["values"]
    assert set(selected) == {"operator", "worker", "exporter"}
    with_operator = render(sets=["worker.enabled=true"])
    assert "exporter" not in _by_component(with_operator, "Deployment")
    assert "operator" in _by_component(with_operator, "Deployment")


def test_every_pod_of_a_release_is_one_installation_to_prometheus(render: Render) -> None:
    for kind, monitor in [("ServiceMonitor", "serviceMonitor"), ("PodMonitor", "podMonitor")]:
        (obj,) = [o for o in render(sets=[f"metrics.{monitor}.enabled=true"]) if o["kind"] == kind]
        key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
        (endpoint,) = obj["spec"][key]
        assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": "rota"}]


def test_metrics_settings_reach_every_process_that_serves_metrics(render: Render) -> None:
    sets = ["worker.enabled=true", "exporter.enabled=true", "metrics.durationBuckets={1,10,60}",
            "metrics.maxTypes=20"]  # fmt: skip
    for component, deployment in _by_component(render(sets=sets), "Deployment").items():
        if component in {"operator", "worker", "exporter"}:
            env = {e["name"]: e.get("value") for e in _pod_spec(deployment)["containers"][0]["env"]}
            assert env["ROTA_METRICS_DURATION_BUCKETS"] == "1,10,60", component
            assert env["ROTA_METRICS_MAX_TYPES"] == "20", component


def test_a_workerpool_needs_the_operator(helm: Path) -> None:
    done = run_helm(
        helm, "template", "rota", str(CHART), "--set", "operator.enabled=false",
        "--set", "worker.enabled=true",
    )  # fmt: skip
    assert done.returncode != 0 and "worker.pool.enabled needs operator.enabled" in done.stderr


def test_the_default_images_are_the_release_the_chart_ships_with(render: Render) -> None:
    # Without an image tag the chart runs its appVersion: the images `make
    # images` builds from the same checkout, tagged with the package's version.
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (version[1], version[1])
    objects = render(sets=["worker.enabled=true"])
    images = {
        c["image"]
        for o in objects
        if o["kind"] in ("Deployment", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"rota-operator:{version[1]}", f"rota-worker:{version[1]}"}, images


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("release", ["1prod", "rota", "7up-rota", "prod.eu"])
def test_every_name_is_a_dns_label_whatever_the_release_name(helm: Path, release: str) -> None:
    """Service names must be DNS-1035 labels (a letter first); helm allows a digit first."""
    sets = ["worker.enabled=true", "web.enabled=true", "exporter.enabled=true",
            "operator.peering.enabled=true", "metrics.dashboard.enabled=true"]  # fmt: skip
    args = [a for s in sets for a in ("--set", s)]
    done = run_helm(helm, "template", release, str(CHART), "--namespace", "rota", *args)
    assert done.returncode == 0, done.stderr
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    for obj in yaml.safe_load_all(done.stdout):
        if obj and obj["kind"] not in cluster_scoped:
            name = obj["metadata"]["name"]
            assert DNS_1035.match(name) and len(name) <= 63, (obj["kind"], name)
            assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == release


@pytest.mark.parametrize(
    "override",
    ["fullnameOverride=Rota", "fullnameOverride=1rota", "nameOverride=my_rota",
     "nameOverride=rota-", "fullnameOverride=" + "r" * 64],
)  # fmt: skip
def test_name_overrides_must_be_dns_labels(helm: Path, override: str) -> None:
    done = run_helm(helm, "template", "rota", str(CHART), "--set", override)
    assert done.returncode != 0, override
    assert override.split("=")[0] in done.stderr, done.stderr


def test_a_pool_s_minimum_cannot_exceed_its_maximum(helm: Path) -> None:
    sets = ["worker.enabled=true", "worker.pool.minReplicas=5", "worker.pool.maxReplicas=2"]
    args = [a for s in sets for a in ("--set", s)]
    done = run_helm(helm, "template", "rota", str(CHART), *args)
    assert done.returncode != 0
    assert "worker.pool.minReplicas (5) must not exceed worker.pool.maxReplicas (2)" in done.stderr
