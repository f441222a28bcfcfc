"""Rota on a real Kubernetes control plane: `make test-cluster`.

Runs against the local cluster of tests/cluster/controlplane.py (Kubernetes 1.20
from Debian's sources: etcd, kube-apiserver with RBAC, controller-manager,
scheduler, a kubelet on containerd) with the images of `make images-local`, and
PostgreSQL served from this machine to the pods. In file order, each step on
the state the previous one left:

    helm install (the migration hook runs `rota migrate`), the operator as a pod
    under the chart's ServiceAccount, a JobSchedule's row, status, printer
    columns and a job it enqueues done, an invalid JobSchedule, the WorkerPool
    scaling 0 -> N -> 0 on aged jobs run by worker pods, the operator and a worker
    killed mid-run without losing a job, helm upgrade, helm uninstall.

Skipped unless ROTA_CLUSTER_TESTS=1 (set by `make test-cluster`), so `make test`
never needs a cluster. The measured times are printed at the end of the run and
written to build/cluster-measures.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
from rota.testing import EmbeddedPostgres
from tests.cluster import controlplane

pytestmark = pytest.mark.skipif(
    os.environ.get("ROTA_CLUSTER_TESTS") != "1",
    reason="needs the local Kubernetes cluster: make test-cluster",
)

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
# Another chart directory, e.g. a copy with one RBAC rule less, to see the run fail.
CHART = Path(os.environ.get("ROTA_CLUSTER_CHART", ROOT / "charts" / "rota"))
MEASURES = ROOT / "build" / "cluster-measures.json"
SNAPSHOTS = ROOT / "build" / "cluster-kubectl.txt"
NS = "rota"
RELEASE = "rota"
TAG = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OPERATOR = f"{RELEASE}-operator"
WORKERS = f"{RELEASE}-worker"
SCHEDULER = f"{RELEASE}-scheduler"

T = TypeVar("T")
measures: dict[str, float] = {}


def measure(name: str, seconds: float) -> None:
    measures[name] = round(seconds, 1)
    MEASURES.parent.mkdir(exist_ok=True)
    MEASURES.write_text(json.dumps(measures, indent=2) + "\n")


def snapshot(kube: Kube, *args: str) -> str:
    """Run a kubectl command and keep its output, the README's examples come from it."""
    text = kube.kubectl(*args)
    with open(SNAPSHOTS, "a") as out:
        out.write(f"$ kubectl {' '.join(args)}\n{text}\n")
    return text


def wait_until(what: str, probe: Callable[[], T], timeout: float, every: float = 1.0) -> T:
    """Poll `probe` until it returns something truthy; fail with its last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except (subprocess.CalledProcessError, psycopg.OperationalError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout:.0f}s (last: {last!r})")
        time.sleep(every)


class Kube:
    """kubectl and helm against the local cluster, as its admin."""

    def __init__(self, kubeconfig: Path) -> None:
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PATH": f"{TOOLS}{os.pathsep}{os.environ.get('PATH', '')}",
            "HELM_CACHE_HOME": str(controlplane.STATE / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(controlplane.STATE / "helm" / "config"),
            "HELM_DATA_HOME": str(controlplane.STATE / "helm" / "data"),
        }

    def run(self, tool: str, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [str(TOOLS / tool), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=600,
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(
                done.returncode, [tool, *args], done.stdout, done.stderr
            )
        return done.stdout + (done.stderr if not check else "")

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self.run("kubectl", *args, stdin=stdin, check=check)

    def helm(self, *args: str) -> str:
        return self.run("helm", *args)

    def get(self, *args: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("-n", NS, "get", *args, "-o", "json")))

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/component={component}"
        return list(self.get("pods", "-l", selector)["items"])

    def ready_pods(self, component: str) -> list[dict[str, Any]]:
        return [
            pod
            for pod in self.pods(component)
            if pod["metadata"].get("deletionTimestamp") is None
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pod.get("status", {}).get("conditions", [])
            )
        ]

    def replicas(self, deployment: str) -> int:
        return int(self.get("deployment", deployment)["spec"].get("replicas", 0))

    def events(self, name: str) -> list[dict[str, Any]]:
        listed = self.get("events", "--field-selector", f"involvedObject.name={name}")
        return list(listed["items"])


@dataclass
class Database:
    here: str  # the URL from this machine
    pods: str  # the URL from inside the cluster

    def rows(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with psycopg.connect(self.here, row_factory=dict_row) as conn:
            return conn.execute(query, params).fetchall()

    def value(self, query: str, params: dict[str, Any] | None = None) -> Any:
        return next(iter(self.rows(query, params)[0].values()))


@pytest.fixture(scope="module")
def kube() -> Kube:
    if not controlplane.alive("kube-apiserver"):
        pytest.fail("the local cluster is not running: make cluster-up (or make test-cluster)")
    SNAPSHOTS.parent.mkdir(exist_ok=True)
    SNAPSHOTS.write_text("")
    MEASURES.unlink(missing_ok=True)
    return Kube(controlplane.ADMIN_KUBECONFIG)


@pytest.fixture(scope="module")
def database() -> Iterator[Database]:
    """PostgreSQL on this machine, reached by the pods through the bridge's gateway."""
    server = EmbeddedPostgres()
    with open(server.data / "postgresql.conf", "a") as conf:
        conf.write("listen_addresses = '*'\n")
    with open(server.data / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {controlplane.POD_SUBNET} trust\n")
    server.start()
    try:
        here = server.create_database("rota")
        pods = f"postgresql://postgres@{controlplane.POD_GATEWAY}:{server.port}/rota"
        yield Database(here=here, pods=pods)
    finally:
        server.destroy()


VALUES = """
worker:
  enabled: true
  image:
    repository: rota-worker-cluster
  handlers: [cluster_handlers]
  concurrency: 2
  leaseSeconds: 10
  terminationGracePeriodSeconds: 30
  pool:
    maxReplicas: 3
    targetQueueAgeSeconds: 5
    scaleDownStabilizationSeconds: 20
    pollIntervalSeconds: 3
operator:
  extraEnv:
    - name: ROTA_SCHEDULE_SYNC_SECONDS
      value: "5"
"""


@pytest.fixture(scope="module")
def release(
    kube: Kube, database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(VALUES)
    # A namespace left by an interrupted run goes first.
    kube.kubectl("delete", "namespace", NS, "--ignore-not-found", "--timeout=180s")
    kube.kubectl("create", "namespace", NS)
    kube.kubectl(
        "-n",
        NS,
        "create",
        "secret",
        "generic",
        "rota-database",
        f"--from-literal=url={database.pods}",
    )
    try:
        started = time.monotonic()
        kube.helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            NS,
            "--values",
            str(values),
            "--wait",
            "--timeout",
            "8m",
        )
        measure("helm_install_seconds", time.monotonic() - started)
        yield values
    finally:
        if RELEASE in kube.helm("list", "--namespace", NS, "--short"):
            kube.kubectl(
                "-n",
                NS,
                "delete",
                "jobschedules,workerpools",
                "--all",
                "--timeout=60s",
                check=False,
            )
            kube.run("helm", "uninstall", RELEASE, "--namespace", NS, "--wait", check=False)
        kube.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def diagnose(kube: Kube) -> str:
    parts = [kube.kubectl("-n", NS, "get", "all,jobschedules,workerpools,events", check=False)]
    for component in ("operator", "worker", "scheduler"):
        parts.append(
            kube.kubectl(
                "-n",
                NS,
                "logs",
                "-l",
                f"app.kubernetes.io/component={component}",
                "--all-containers",
                "--tail=40",
                check=False,
            )
        )
    return "\n".join(parts)


# -- install ------------------------------------------------------------------


def test_helm_install_runs_the_migration_hook(
    kube: Kube, database: Database, release: Path
) -> None:
    assert "STATUS: deployed" in kube.helm("status", RELEASE, "--namespace", NS)
    applied = database.value("SELECT count(*) FROM rota.migrations")
    assert applied >= 3, "the pre-install hook ran `rota migrate`"
    # The hook Job deletes itself on success; its completion left an Event.
    events = kube.get("events")["items"]
    assert any(
        e["involvedObject"]["kind"] == "Job" and e["reason"] == "Completed" for e in events
    ), [(e["involvedObject"]["name"], e["reason"]) for e in events]


def test_the_operator_runs_as_a_pod_under_the_chart_service_account(
    kube: Kube, release: Path
) -> None:
    (pod,) = wait_until("a ready operator pod", lambda: kube.ready_pods("operator"), 120)
    assert pod["spec"]["serviceAccountName"] == OPERATOR
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    wait_until("a ready scheduler pod", lambda: kube.ready_pods("scheduler"), 120)
    # Every call the operator makes runs with the chart's RBAC: nothing refused.
    logs = kube.kubectl("-n", NS, "logs", f"deployment/{OPERATOR}")
    assert "Forbidden" not in logs and " 403" not in logs, logs[-3000:]
    can = kube.kubectl(
        "auth",
        "can-i",
        "patch",
        "deployments",
        "--subresource=scale",
        "-n",
        NS,
        f"--as=system:serviceaccount:{NS}:{OPERATOR}",
        check=False,
    )
    assert can.strip().startswith("yes"), can
    cannot = kube.kubectl(
        "auth",
        "can-i",
        "delete",
        "deployments",
        "-n",
        NS,
        f"--as=system:serviceaccount:{NS}:{OPERATOR}",
        check=False,
    )
    assert cannot.strip().startswith("no"), cannot


# -- JobSchedule ----------------------------------------------------------------

TICK = """
apiVersion: rota.dev/v1
kind: JobSchedule
metadata:
  name: tick
spec:
  jobType: cluster.tick
  schedule: "* * * * *"
  payload: {from: cluster}
"""

BROKEN_CRON = """
apiVersion: rota.dev/v1
kind: JobSchedule
metadata:
  name: broken
spec:
  jobType: cluster.tick
  schedule: "61 * * * *"
"""

BAD_BOUNDS = """
apiVersion: rota.dev/v1
kind: WorkerPool
metadata:
  name: bad-bounds
spec:
  scaleTargetRef: {name: nothing}
  minReplicas: 3
  maxReplicas: 1
"""

BAD_POLICY = """
apiVersion: rota.dev/v1
kind: JobSchedule
metadata:
  name: bad-policy
spec:
  jobType: cluster.tick
  schedule: "@hourly"
  concurrencyPolicy: Sometimes
"""


def test_a_jobschedule_becomes_a_row_and_its_jobs_run(
    kube: Kube, database: Database, release: Path
) -> None:
    started = time.monotonic()
    kube.kubectl("-n", NS, "apply", "-f", "-", stdin=TICK)
    row = wait_until(
        "the schedule row",
        lambda: database.rows("SELECT * FROM rota.schedule WHERE name = 'rota/tick'"),
        120,
        every=0.2,
    )[0]
    measure("jobschedule_to_row_seconds", time.monotonic() - started)
    assert row["job_type"] == "cluster.tick" and row["cron"] == "* * * * *"
    assert row["payload"] == {"from": "cluster"}
    kube.kubectl("-n", NS, "wait", "--for=condition=Ready", "jobschedule/tick", "--timeout=120s")
    measure("jobschedule_to_ready_seconds", time.monotonic() - started)
    status = kube.get("jobschedule", "tick")["status"]
    assert status["nextRunAt"] and status["observedGeneration"] == 1
    table = snapshot(kube, "-n", NS, "get", "jobschedules")
    header, line = table.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "NEXT", "RUN"]
    assert status["nextRunAt"] in line and "True" in line, table
    # The scheduler Deployment enqueues the minute's job; a worker pod runs it.
    done = wait_until(
        "a scheduled job done by a worker pod",
        lambda: database.rows(
            "SELECT locked_by, finished_at - created_at AS took FROM rota.job"
            " WHERE type = 'cluster.tick' AND status = 'done'"
        ),
        180,
        every=2,
    )
    assert done[0]["locked_by"].startswith(f"{WORKERS}-"), done
    wait_until(
        "lastSlot in the status",
        lambda: kube.get("jobschedule", "tick")["status"].get("lastSlot"),
        60,
    )
    snapshot(kube, "-n", NS, "get", "jobschedules")
    kube.kubectl("-n", NS, "delete", "jobschedule", "tick", "--timeout=60s")
    assert database.value("SELECT count(*) FROM rota.schedule WHERE name = 'rota/tick'") == 0


def test_an_invalid_jobschedule_is_refused_or_not_ready(
    kube: Kube, database: Database, release: Path
) -> None:
    # What the schema can say, the API server refuses.
    refused = kube.kubectl("-n", NS, "apply", "-f", "-", stdin=BAD_POLICY, check=False)
    assert "Unsupported value" in refused or "concurrencyPolicy" in refused, refused
    assert "bad-policy" not in kube.kubectl("-n", NS, "get", "jobschedules")
    # What it cannot (the cron expression), the operator marks Ready=False, with an Event.
    kube.kubectl("-n", NS, "apply", "-f", "-", stdin=BROKEN_CRON)
    kube.kubectl(
        "-n", NS, "wait", "--for=condition=Ready=false", "jobschedule/broken", "--timeout=120s"
    )
    snapshot(kube, "-n", NS, "get", "jobschedules")
    (condition,) = kube.get("jobschedule", "broken")["status"]["conditions"]
    assert condition["reason"] == "InvalidSpec" and "61" in condition["message"]
    events = wait_until("the InvalidSpec Event", lambda: kube.events("broken"), 60)
    assert any(e["type"] == "Warning" and e["reason"] == "InvalidSpec" for e in events), events
    assert database.value("SELECT count(*) FROM rota.schedule WHERE name = 'rota/broken'") == 0
    kube.kubectl("-n", NS, "delete", "jobschedule", "broken", "--timeout=60s")


def _weighty(blob: str) -> str:
    """A JobSchedule whose payload holds some 150 kB, as `kubectl apply` reads it."""
    return json.dumps({
        "apiVersion": "rota.dev/v1", "kind": "JobSchedule", "metadata": {"name": "weighty"},
        "spec": {"jobType": "cluster.weighty", "schedule": "0 0 1 1 *", "payload": {"b": blob}},
    })  # fmt: skip


def test_a_jobschedule_with_a_large_payload_is_handled(
    kube: Kube, database: Database, release: Path
) -> None:
    # An object holds at most 256 KiB of annotations: `kubectl apply` keeps a
    # copy of the spec in one, and kopf's record of the spec it handled must fit
    # beside it, or every patch of the object (its status too) is refused.
    for blob in ("x" * 150_000, "y" * 150_000):  # created, then its payload alone changed
        kube.kubectl("-n", NS, "apply", "-f", "-", stdin=_weighty(blob))
        wait_until(
            "the payload stored",
            lambda b=blob: database.rows(
                "SELECT 1 FROM rota.schedule WHERE name = 'rota/weighty' AND payload->>'b' = %(b)s",
                {"b": b},
            ),
            120,
        )
        generation = kube.get("jobschedule", "weighty")["metadata"]["generation"]
        status = wait_until(
            "the status of the current generation",
            lambda g=generation: (
                (got := kube.get("jobschedule", "weighty").get("status") or {})
                and got.get("observedGeneration") == g
                and got
            ),
            120,
        )
        (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
        assert ready["status"] == "True", ready
        assert status["nextRunAt"]
    kube.kubectl("-n", NS, "delete", "jobschedule", "weighty", "--timeout=60s")
    assert database.value("SELECT count(*) FROM rota.schedule WHERE name = 'rota/weighty'") == 0


def test_workerpool_bounds_hold_without_cel(kube: Kube, release: Path) -> None:
    """Below 1.25 the API server has no CEL rule for min <= max: the operator refuses it."""
    out = kube.kubectl("-n", NS, "apply", "-f", "-", stdin=BAD_BOUNDS, check=False)
    if server_minor(kube) >= 25:
        assert "minReplicas must not exceed maxReplicas" in out, out
        return
    assert "created" in out, out
    kube.kubectl(
        "-n", NS, "wait", "--for=condition=Ready=false", "workerpool/bad-bounds", "--timeout=120s"
    )
    (condition,) = kube.get("workerpool", "bad-bounds")["status"]["conditions"]
    assert condition["reason"] == "InvalidSpec", condition
    assert "minReplicas 3 > maxReplicas 1" in condition["message"], condition
    kube.kubectl("-n", NS, "delete", "workerpool", "bad-bounds", "--timeout=60s")


# -- WorkerPool -------------------------------------------------------------------


def enqueue_aged(database: Database, count: int, seconds: float) -> list[int]:
    """Jobs that became ready a minute ago, so the queue is old at once."""
    run_at = datetime.now(UTC) - timedelta(minutes=1)
    jobs = [rota.NewJob("cluster.work", {"seconds": seconds}, run_at=run_at) for _ in range(count)]
    return rota.enqueue_many(database.here, jobs)


def statuses(database: Database, ids: list[int]) -> dict[str, int]:
    rows = database.rows(
        "SELECT status, count(*) AS n FROM rota.job WHERE id = ANY(%(ids)s) GROUP BY status",
        {"ids": ids},
    )
    return {row["status"]: row["n"] for row in rows}


def test_the_workerpool_scales_workers_from_zero_and_back(
    kube: Kube, database: Database, release: Path
) -> None:
    # Helm's Deployment starts with one worker; an idle pool takes it to zero.
    wait_until("the idle pool at zero", lambda: kube.replicas(WORKERS) == 0, 180)
    wait_until("no worker pod left", lambda: not kube.pods("worker"), 120)
    started = time.monotonic()
    ids = enqueue_aged(database, 24, 3)
    wait_until("the pool above one worker", lambda: kube.replicas(WORKERS) >= 2, 120)
    measure("scale_from_zero_decision_seconds", time.monotonic() - started)
    wait_until("a ready worker pod", lambda: kube.ready_pods("worker"), 180)
    measure("scale_from_zero_to_ready_pod_seconds", time.monotonic() - started)
    wait_until("every job done", lambda: statuses(database, ids) == {"done": 24}, 300, every=2)
    measure("24_jobs_from_zero_done_seconds", time.monotonic() - started)
    hosts = {
        row["locked_by"].split(":")[0]
        for row in database.rows(
            "SELECT locked_by FROM rota.job WHERE id = ANY(%(ids)s)", {"ids": ids}
        )
    }
    assert all(host.startswith(f"{WORKERS}-") for host in hosts), hosts
    snapshot(kube, "-n", NS, "get", "workerpools")
    pool = kube.get("workerpool", WORKERS)
    assert pool["status"]["desiredReplicas"] >= 2
    scaled = [e["message"] for e in kube.events(WORKERS) if e["reason"] == "Scaled"]
    assert scaled, kube.events(WORKERS)
    started = time.monotonic()
    wait_until("the pool back at zero", lambda: kube.replicas(WORKERS) == 0, 180)
    wait_until("the worker pods gone", lambda: not kube.pods("worker"), 120)
    measure("idle_to_zero_seconds", time.monotonic() - started)


def test_a_scale_down_never_stops_a_pod_in_the_middle_of_its_job(
    kube: Kube, database: Database, release: Path
) -> None:
    # A burst brings up several workers; one long job outlives the burst by far
    # more than the stabilization window (20 s). The pool shrinks to the pod that
    # runs it, never below, and that pod is never the one stopped.
    wait_until("the idle pool at zero", lambda: kube.replicas(WORKERS) == 0, 180)
    run_at = datetime.now(UTC) - timedelta(minutes=1)
    (long_id,) = rota.enqueue_many(
        database.here, [rota.NewJob("cluster.work", {"seconds": 90}, run_at=run_at)]
    )
    ids = enqueue_aged(database, 12, 2)
    wait_until("the pool above one worker", lambda: kube.replicas(WORKERS) >= 2, 120)
    wait_until("the burst done", lambda: statuses(database, ids) == {"done": 12}, 300, every=2)
    (row,) = database.rows("SELECT locked_by FROM rota.job WHERE id = %(id)s", {"id": long_id})
    holder = row["locked_by"].split(":")[0]
    holder_uid = kube.get("pod", holder)["metadata"]["uid"]
    wait_until("the pool down to the busy pod", lambda: kube.replicas(WORKERS) == 1, 120)
    pool = kube.get("workerpool", WORKERS)
    assert pool["status"]["decidedBy"] == "JobsRunning", pool["status"]
    assert pool["status"]["minReplicasForRunningJobs"] == 1, pool["status"]
    snapshot(kube, "-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=worker")

    def long_job_done() -> bool:
        done = statuses(database, [long_id]) == {"done": 1}
        assert done or kube.replicas(WORKERS) >= 1, "the pool went below its running job"
        return done

    wait_until("the long job done", long_job_done, 180, every=2)
    messages = [e["message"] for e in kube.events(WORKERS) if e["reason"] == "Scaled"]
    assert any(m.startswith("JobsRunning") for m in messages), messages
    if honours_deletion_cost(kube):
        (done,) = database.rows(
            "SELECT attempts, releases FROM rota.job WHERE id = %(id)s", {"id": long_id}
        )
        assert (done["attempts"], done["releases"]) == (1, 0), done
        holder_pod = kube.get("pod", holder)
        assert holder_pod["metadata"]["uid"] == holder_uid  # the same pod ran it to the end
        assert holder_pod["status"]["containerStatuses"][0]["restartCount"] == 0
    # Kubernetes before 1.22 (the local control plane is 1.20) ignores the
    # pod-deletion-cost annotation: its ReplicaSet may stop the busy pod, whose
    # worker then finishes the job within its grace period or gives it back.
    # Only the floor is checked there.
    wait_until("the pool back at zero", lambda: kube.replicas(WORKERS) == 0, 180)


def honours_deletion_cost(kube: Kube) -> bool:
    """Whether the ReplicaSets of this cluster read controller.kubernetes.io/pod-deletion-cost
    (beta and on by default from Kubernetes 1.22)."""
    server = json.loads(kube.kubectl("version", "-o", "json"))["serverVersion"]
    return (int(server["major"]), int(server["minor"].rstrip("+"))) >= (1, 22)


def container_id(pod: dict[str, Any]) -> str | None:
    """The pod's container as containerd names it; None until the kubelet reports it
    (a worker can claim jobs before its pod's status says it runs)."""
    (status,) = pod["status"].get("containerStatuses") or [{}]
    found = status.get("containerID")
    return str(found).removeprefix("containerd://") if found else None


def test_killing_the_operator_and_a_worker_mid_run_loses_no_job(
    kube: Kube, database: Database, release: Path
) -> None:
    ids = enqueue_aged(database, 16, 10)
    wait_until(
        "jobs running in worker pods",
        lambda: database.rows(
            "SELECT 1 FROM rota.job WHERE id = ANY(%(ids)s) AND status = 'running'", {"ids": ids}
        ),
        180,
    )
    snapshot(kube, "-n", NS, "get", "workerpools")
    snapshot(kube, "-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=worker")
    (operator,) = kube.pods("operator")
    # The operator pod goes at once; its ReplicaSet makes a new one.
    kube.kubectl(
        "-n", NS, "delete", "pod", operator["metadata"]["name"], "--grace-period=0", "--force"
    )

    def busy_worker() -> tuple[str, list[int]] | None:
        """A worker container with a job that has most of its 10 s still to run."""
        rows = database.rows(
            "SELECT id, split_part(locked_by, ':', 1) AS pod FROM rota.job"
            " WHERE id = ANY(%(ids)s) AND status = 'running'"
            " AND started_at > now() - interval '4 seconds'",
            {"ids": ids},
        )
        for row in rows:
            found = container_id(kube.get("pod", row["pod"]))
            if found:
                return found, [r["id"] for r in rows if r["pod"] == row["pod"]]
        return None

    # The worker process dies with SIGKILL, mid-job: no chance to hand its jobs back.
    victim_container, held = wait_until("a worker mid-job", busy_worker, 120)
    subprocess.run(
        [
            "ctr",
            "--address",
            str(controlplane.CONTAINERD_SOCK),
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "-s",
            "SIGKILL",
            victim_container,
        ],
        check=True,
    )
    wait_until(
        "a new operator pod",
        lambda: [
            p
            for p in kube.ready_pods("operator")
            if p["metadata"]["name"] != operator["metadata"]["name"]
        ],
        180,
    )
    wait_until("every job done", lambda: statuses(database, ids) == {"done": 16}, 300, every=2)
    # The jobs the killed process held were run again after their lease, not lost. (The
    # kubelet restarts the container, or the shrinking pool removes its pod first.)
    rerun = database.rows(
        "SELECT id, attempts FROM rota.job WHERE id = ANY(%(held)s)", {"held": held}
    )
    assert rerun and all(row["attempts"] >= 2 for row in rerun), rerun
    # The new operator keeps scaling: the pool returns to zero.
    wait_until("the pool back at zero", lambda: kube.replicas(WORKERS) == 0, 180)


# -- upgrade and uninstall ------------------------------------------------------


def test_helm_upgrade_reruns_migrations_and_keeps_serving(
    kube: Kube, database: Database, release: Path
) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    started = time.monotonic()
    kube.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "worker.concurrency=3",
        # The migration Job also switches the key index, while the workers serve.
        "--set",
        "migrations.keyIndex=partial",
        "--wait",
        "--timeout",
        "8m",
    )
    measure("helm_upgrade_seconds", time.monotonic() - started)
    assert "REVISION: 2" in kube.helm("status", RELEASE, "--namespace", NS)
    jobs = [
        e
        for e in kube.get("events")["items"]
        if e["involvedObject"]["kind"] == "Job"
        and e["reason"] == "Completed"
        and datetime.fromisoformat(e["lastTimestamp"]) >= before
    ]
    assert jobs, "the pre-upgrade hook ran the migrations again"
    assert database.value(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'job_idempotency_key_idx'"
    ).endswith("WHERE (idempotency_key IS NOT NULL)")
    assert not database.value(
        "SELECT count(*) FROM pg_constraint WHERE conname = 'job_idempotency_key_key'"
    )
    args = kube.get("deployment", WORKERS)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--concurrency=3" in args, args
    kube.kubectl("-n", NS, "apply", "-f", "-", stdin=TICK)
    kube.kubectl("-n", NS, "wait", "--for=condition=Ready", "jobschedule/tick", "--timeout=120s")
    assert database.value("SELECT count(*) FROM rota.schedule WHERE name = 'rota/tick'") == 1
    snapshot(kube, "-n", NS, "get", "rota")
    snapshot(kube, "-n", NS, "get", "deployments,pods")


def test_helm_uninstall_as_the_readme_says(kube: Kube, database: Database, release: Path) -> None:
    # JobSchedules carry the operator's finalizer: they go while it still runs. The
    # WorkerPool is the release's and has none: it goes with the release.
    assert not kube.get("workerpool", WORKERS)["metadata"].get("finalizers")
    kube.kubectl("-n", NS, "delete", "jobschedules", "--all", "--timeout=60s")
    assert database.value("SELECT count(*) FROM rota.schedule WHERE job_type LIKE 'cluster.%'") == 0
    kube.helm("uninstall", RELEASE, "--namespace", NS, "--wait")
    assert not kube.kubectl("-n", NS, "get", "workerpools", "-o", "name").strip()
    wait_until("every pod of the release gone", lambda: not kube.get("pods")["items"], 180)
    crds = kube.kubectl("get", "crd", "-o", "name")
    assert "jobschedules.rota.dev" in crds and "workerpools.rota.dev" in crds, "crds.keep"
    kube.kubectl("delete", "namespace", NS, "--timeout=120s")
    # The database is left as it was: jobs and their history stay.
    assert database.value("SELECT count(*) FROM rota.job WHERE status = 'done'") >= 40


def test_crds_apply_with_kubectl(kube: Kube) -> None:
    """`kubectl apply -f crds/` as the README documents it for this version."""
    if server_minor(kube) < 25:
        plain = kube.kubectl("apply", "-f", str(ROOT / "crds"), check=False)
        assert 'unknown field "x-kubernetes-validations"' in plain, plain
    out = kube.kubectl(
        "apply",
        "-f",
        str(ROOT / "crds"),
        "-f",
        str(ROOT / "crds" / "kopf"),
        *validate_flag(kube),
        check=False,
    )
    assert "error" not in out.lower(), out


def server_minor(kube: Kube) -> int:
    version = json.loads(kube.kubectl("version", "-o", "json"))["serverVersion"]
    return int(version["minor"].rstrip("+"))


def validate_flag(kube: Kube) -> list[str]:
    return ["--validate=false"] if server_minor(kube) < 25 else []
