"""Installing Rota as in production, on the real 1.20 cluster: `make test-cluster`.

In file order, each step on the state the previous one left:

    alpha: the previous release (charts/rota and the images of the commit in
      tests/cluster/previous-release, the last of 0.3, built as tag "previous"
      by `make images-previous`) installed with workers and the
      console; jobs running when it is upgraded to this chart and these images:
      none lost, none run twice, the console's key kept, the hook-made
      WorkerPool taken over by the release;
    beta: a second installation in another namespace, on a PostgreSQL that
      refuses connections without TLS, reached with sslmode=verify-full through
      a mounted CA, with operator.instance=beta;
    each operator reconciles only its own JobSchedules and WorkerPool;
    both uninstalled: nothing of either release is left but what the docs say
      stays (the console's key Secret, the CRDs, the database).

Skipped unless ROTA_CLUSTER_TESTS=1, like test_cluster.py, whose helpers it uses.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg.rows import dict_row

import rota
from rota.testing import EmbeddedPostgres
from tests.cluster import controlplane
from tests.cluster.test_cluster import CHART, ROOT, Kube, measure, validate_flag, wait_until
from tests.cluster.tls import SystemPostgres, make_certificates, require_tls

pytestmark = pytest.mark.skipif(
    __import__("os").environ.get("ROTA_CLUSTER_TESTS") != "1",
    reason="needs the local Kubernetes cluster: make test-cluster",
)

ALPHA, ALPHA_NS = "alpha", "rota-alpha"
BETA, BETA_NS = "beta", "rota-beta"
JOBS = 60
ALPHA_VALUES = ROOT / "build" / "cluster-alpha-values.yaml"

WORKER_VALUES = """
worker:
  enabled: true
  image:
    repository: rota-worker-cluster
  handlers: [cluster_handlers]
  concurrency: 4
  leaseSeconds: 10
  pool:
    maxReplicas: 3
    targetQueueAgeSeconds: 3
    scaleDownStabilizationSeconds: 30
    pollIntervalSeconds: 3
operator:
  extraEnv:
    - name: ROTA_SCHEDULE_SYNC_SECONDS
      value: "5"
"""


class Db:
    def __init__(self, here: str, pods: str) -> None:
        self.here, self.pods = here, pods

    def value(self, query: str, params: dict[str, Any] | None = None) -> Any:
        with psycopg.connect(self.here, row_factory=dict_row) as conn:
            row = conn.execute(query, params).fetchone()
        return next(iter(row.values())) if row else None


def kubectl_json(kube: Kube, namespace: str, *args: str) -> dict[str, Any]:
    return dict(json.loads(kube.kubectl("-n", namespace, "get", *args, "-o", "json")))


@pytest.fixture(scope="module")
def kube() -> Kube:
    if not controlplane.alive("kube-apiserver"):
        pytest.fail("the local cluster is not running: make cluster-up (or make test-cluster)")
    return Kube(controlplane.ADMIN_KUBECONFIG)


@pytest.fixture(scope="module")
def plain_db() -> Iterator[Db]:
    server = EmbeddedPostgres()
    with open(server.data / "postgresql.conf", "a") as conf:
        conf.write("listen_addresses = '*'\n")
    with open(server.data / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {controlplane.POD_SUBNET} trust\n")
    server.start()
    try:
        here = server.create_database("rota")
        yield Db(here, f"postgresql://postgres@{controlplane.POD_GATEWAY}:{server.port}/rota")
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def tls_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Db, Path]]:
    """A PostgreSQL that refuses pods without TLS; its certificate names the pods' gateway."""
    certificates = tmp_path_factory.mktemp("tls")
    ca = make_certificates(certificates, controlplane.POD_GATEWAY)
    server = SystemPostgres()
    require_tls(server, certificates, controlplane.POD_SUBNET)
    server.start()
    try:
        here = server.create_database("rota")
        yield Db(here, f"postgresql://postgres@{controlplane.POD_GATEWAY}:{server.port}/rota"), ca
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart as the last release shipped it (the commit in previous-release)."""
    ref = (Path(__file__).parent / "previous-release").read_text().strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "charts/rota"],
        capture_output=True,
        check=True,
    ).stdout
    target = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target / "charts" / "rota"


def fresh_namespace(kube: Kube, namespace: str, url: str) -> None:
    # A run interrupted under the previous release leaves its hook-made WorkerPool,
    # whose finalizer no operator will take off any more: drop it first.
    left = kube.kubectl(
        "-n", namespace, "get", "workerpools,jobschedules", "-o", "name", check=False
    )
    for name in left.split():
        if "/" in name and "Error" not in left:
            patch = '{"metadata":{"finalizers":[]}}'
            kube.kubectl("-n", namespace, "patch", name, "--type=merge", "-p", patch, check=False)
    kube.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--timeout=180s")
    kube.kubectl("create", "namespace", namespace)
    kube.kubectl(
        "-n", namespace, "create", "secret", "generic", "rota-database", f"--from-literal=url={url}"
    )


def helm(kube: Kube, *args: str) -> str:
    return kube.helm(*args, "--wait", "--timeout", "8m")


def pool_name(release: str) -> str:
    return f"{release}-rota-worker"


# -- alpha: the previous chart, upgraded while jobs run ----------------------------


def test_the_previous_release_installs(kube: Kube, plain_db: Db, previous_chart: Path) -> None:
    fresh_namespace(kube, ALPHA_NS, plain_db.pods)
    # Two installations: the CRDs are managed apart from both releases (this
    # version's, applied as the docs say), so neither release owns them.
    kube.kubectl("apply", "-f", str(ROOT / "crds"), *validate_flag(kube))
    old = ["--set", "operator.image.tag=previous", "--set", "worker.image.tag=previous"]
    ALPHA_VALUES.parent.mkdir(parents=True, exist_ok=True)
    ALPHA_VALUES.write_text(WORKER_VALUES + "crds:\n  enabled: false\nweb:\n  enabled: true\n")
    helm(kube, "install", ALPHA, str(previous_chart), "-n", ALPHA_NS, "-f", str(ALPHA_VALUES), *old)
    pool = kubectl_json(kube, ALPHA_NS, "workerpool", pool_name(ALPHA))
    assert pool["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"


def test_upgrading_while_jobs_run_loses_and_doubles_none(kube: Kube, plain_db: Db) -> None:
    old_key = kubectl_json(kube, ALPHA_NS, "secret", f"{ALPHA}-rota-web-secret")["data"]["secret"]
    with psycopg.connect(plain_db.here) as conn:
        ids = rota.enqueue_many(
            conn, [rota.NewJob("cluster.work", {"seconds": 2}) for _ in range(JOBS)]
        )
    wait_until(
        "jobs running on the old release's workers",
        lambda: plain_db.value("SELECT count(*) FROM rota.job WHERE status = 'running'"),
        240,
    )
    started = time.monotonic()
    # The same values, this chart's defaults for the rest (the images of this version).
    # --take-ownership, once, as the docs say for an upgrade from 0.3: the old chart
    # made the WorkerPool as a hook, which Helm would otherwise refuse to take over.
    helm(
        kube, "upgrade", ALPHA, str(CHART), "-n", ALPHA_NS, "-f", str(ALPHA_VALUES),
        "--take-ownership",
    )  # fmt: skip
    measure("upgrade_from_previous_chart_seconds", time.monotonic() - started)
    wait_until(
        "every job done",
        lambda: (
            plain_db.value(
                "SELECT count(*) FROM rota.job WHERE id = ANY(%(ids)s) AND status = 'done'",
                {"ids": ids},
            )
            == JOBS
        ),
        600,
        every=3,
    )
    # One claim each: no job was run twice, none was lost.
    attempts = plain_db.value(
        "SELECT array_agg(DISTINCT attempts) FROM rota.job WHERE id = ANY(%(ids)s)", {"ids": ids}
    )
    assert attempts == [1], attempts
    # The console's key survived (copied by the chart's hook), and the old Secret is gone.
    new = kubectl_json(kube, ALPHA_NS, "secret", f"{ALPHA}-rota-web-signing-key")
    assert new["data"]["secret"] == old_key
    assert base64.b64decode(old_key)
    # The hook-made WorkerPool is now an ordinary object of the release.
    pool = kubectl_json(kube, ALPHA_NS, "workerpool", pool_name(ALPHA))
    notes = pool["metadata"].get("annotations") or {}
    assert "helm.sh/hook" not in notes, notes
    assert notes["meta.helm.sh/release-name"] == ALPHA
    manifest = kube.helm("get", "manifest", ALPHA, "-n", ALPHA_NS)
    assert "kind: WorkerPool" in manifest
    assert not pool["metadata"].get("finalizers")


# -- beta: a second installation, TLS with verify-full ---------------------------


def test_a_second_installation_reaches_a_tls_only_database_through_a_mounted_ca(
    kube: Kube, tls_db: tuple[Db, Path], tmp_path: Path
) -> None:
    db, ca = tls_db
    fresh_namespace(kube, BETA_NS, db.pods)
    kube.kubectl(
        "-n", BETA_NS, "create", "secret", "generic", "postgres-ca", f"--from-file=ca.crt={ca}"
    )
    values = tmp_path / "values.yaml"
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "worker"}},
    }
    settings = yaml.safe_load(WORKER_VALUES)
    settings["crds"] = {"enabled": False}
    settings["database"] = {"tls": {"sslmode": "verify-full", "caSecret": "postgres-ca"}}
    settings["worker"]["topologySpreadConstraints"] = [spread]
    for component in ("operator", "scheduler", "worker"):
        settings.setdefault(component, {})["podDisruptionBudget"] = {"enabled": True}
    values.write_text(yaml.safe_dump(settings))
    helm(
        kube, "install", BETA, str(CHART), "-n", BETA_NS, "--values", str(values),
        "--set", "operator.instance=beta",
    )  # fmt: skip
    assert db.value("SELECT count(*) FROM rota.migrations") >= 3
    # 1.20 serves what the chart wrote for it: budgets as policy/v1beta1, topology spread,
    # and the scheduler's and reaper's readiness (--wait saw both /readyz answer).
    budgets = kubectl_json(kube, BETA_NS, "poddisruptionbudgets")["items"]
    assert len(budgets) == 3 and {b["apiVersion"] for b in budgets} <= {"policy/v1beta1"}, budgets
    deployment = kubectl_json(kube, BETA_NS, "deployment", f"{BETA}-rota-worker")
    assert deployment["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["maxSkew"] == 1
    scheduler = kubectl_json(kube, BETA_NS, "deployment", f"{BETA}-rota-scheduler")
    assert scheduler["status"].get("readyReplicas") == 1
    # Every component's connection from a pod is TLS (the server refuses any other).
    wait_until(
        "the operator and scheduler connected over TLS",
        lambda: (
            db.value(
                "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)"
                " WHERE ssl AND client_addr <<= %(net)s::inet",
                {"net": controlplane.POD_SUBNET},
            )
            >= 2
        ),
        120,
    )


# -- two installations, each with its own objects -------------------------------


def schedule(name: str, instance: str = "") -> str:
    labels = f"\n  labels: {{rota.dev/instance: {instance}}}" if instance else ""
    return f"""
apiVersion: rota.dev/v1
kind: JobSchedule
metadata:
  name: {name}{labels}
spec:
  jobType: cluster.tick
  schedule: "@hourly"
"""


def test_each_installation_reconciles_only_its_own(
    kube: Kube, plain_db: Db, tls_db: tuple[Db, Path]
) -> None:
    beta_db, _ = tls_db
    kube.kubectl("-n", ALPHA_NS, "apply", "-f", "-", stdin=schedule("mine"))
    kube.kubectl("-n", BETA_NS, "apply", "-f", "-", stdin=schedule("mine", "beta"))
    kube.kubectl("-n", BETA_NS, "apply", "-f", "-", stdin=schedule("stray"))  # no instance label
    for namespace in (ALPHA_NS, BETA_NS):
        kube.kubectl(
            "-n", namespace, "wait", "--for=condition=Ready", "jobschedule/mine", "--timeout=120s"
        )
    rows = "SELECT array_agg(name ORDER BY name) FROM rota.schedule WHERE job_type = 'cluster.tick'"
    assert plain_db.value(rows) == [f"{ALPHA_NS}/mine"]
    assert beta_db.value(rows) == [f"{BETA_NS}/mine"]
    stray = kubectl_json(kube, BETA_NS, "jobschedule", "stray")
    assert not stray.get("status") and not stray["metadata"].get("finalizers"), stray
    mine = kubectl_json(kube, BETA_NS, "jobschedule", "mine")
    assert mine["metadata"]["finalizers"] == ["beta.rota.dev/finalizer"]
    for namespace, release in ((ALPHA_NS, ALPHA), (BETA_NS, BETA)):
        pool = kubectl_json(kube, namespace, "workerpool", pool_name(release))
        assert pool["status"]["decidedBy"], pool["status"]
        assert pool["status"]["conflictingControllers"] == []


# -- uninstall ------------------------------------------------------------------

LEFT_KINDS = "all,secrets,serviceaccounts,roles,rolebindings,configmaps,jobs,pdb,workerpools"


def leftovers(kube: Kube, namespace: str) -> list[str]:
    found = kube.kubectl("-n", namespace, "get", LEFT_KINDS, "-o", "name").split()
    expected = {
        "secret/rota-database",  # ours, made before the install
        "secret/postgres-ca",
        f"secret/{ALPHA}-rota-web-signing-key",  # documented: the console's key stays
        "serviceaccount/default",
        "configmap/kube-root-ca.crt",
    }
    return [
        name for name in found if name not in expected and not name.startswith("secret/default-")
    ]


def test_uninstalling_leaves_only_what_the_docs_say(kube: Kube) -> None:
    for namespace in (ALPHA_NS, BETA_NS):
        kube.kubectl("-n", namespace, "delete", "jobschedules", "--all", "--timeout=120s")
    kube.helm("uninstall", ALPHA, "-n", ALPHA_NS, "--wait")
    kube.helm("uninstall", BETA, "-n", BETA_NS, "--wait")
    for namespace in (ALPHA_NS, BETA_NS):

        def empty(ns: str = namespace) -> bool:
            return not leftovers(kube, ns)

        wait_until(f"{namespace} empty", empty, 180)
    cluster_wide = kube.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name")
    assert f"{ALPHA}-rota-operator" not in cluster_wide
    assert f"{BETA}-rota-operator" not in cluster_wide
    assert "workerpools.rota.dev" in kube.kubectl("get", "crd", "-o", "name")  # crds.keep
    for namespace in (ALPHA_NS, BETA_NS):
        kube.kubectl("delete", "namespace", namespace, "--timeout=180s")
