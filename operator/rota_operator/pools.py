"""One poll of a WorkerPool: measure the queue, decide, scale, report.

`poll_once()` is the whole reconcile step as a plain function (STYLE: a pure
decision in `scaling`, a run-once step here, a thin loop in `handlers`). It
talks to the database through the rota core and to Kubernetes through `kube`;
it never raises for an outage: failures become a condition and an error count,
and the next poll tries again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rota import limits as checks
from rota import status as queue_status
from rota import workers
from rota.errors import RotaError
from rota_operator import metrics, pool_inputs, pool_reports
from rota_operator.conditions import now_rfc3339, with_condition
from rota_operator.kube import Kube, KubeError, ObjectRef, Replicas
from rota_operator.scaling import Decision, PoolLimits, QueueSample, ScaleMemory, decide

logger = logging.getLogger(__name__)

API_VERSION = "rota.dev/v1"
KIND = "WorkerPool"

SPEC_DEFAULTS: dict[str, Any] = {
    "minReplicas": 0,
    "targetQueueAgeSeconds": 30,
    "scaleDownStabilizationSeconds": 300,
    "pollIntervalSeconds": 15,
    "paused": False,
}
"""The CRD's defaults, applied again here for objects that did not pass through them."""


@dataclass(frozen=True)
class PoolSpec:
    """A WorkerPool's spec with the defaults filled in."""

    target: str
    job_types: list[str] | None
    limits: PoolLimits
    poll_interval_seconds: float
    paused: bool = False
    jobs_per_replica: int | None = None
    """spec.jobsPerReplica; None reads it from the target (pool_inputs.jobs_per_replica)."""

    @classmethod
    def parse(cls, spec: Mapping[str, Any], default_poll: float) -> PoolSpec:
        values = {**SPEC_DEFAULTS, "pollIntervalSeconds": default_poll, **spec}
        # The core's checks (InvalidInput is a ValueError): replicas within what a
        # Deployment holds, seconds that are finite and at most ten years.
        minimum = checks.whole(values["minReplicas"], "minReplicas", 0)
        limits = PoolLimits(
            min_replicas=minimum,
            max_replicas=checks.whole(values.get("maxReplicas", minimum or 1), "maxReplicas", 0),
            target_age_seconds=checks.interval_seconds(
                values["targetQueueAgeSeconds"], "targetQueueAgeSeconds"
            ),
            stabilization_seconds=checks.delay_seconds(
                values["scaleDownStabilizationSeconds"], "scaleDownStabilizationSeconds"
            ),
        )
        types = values.get("jobTypes")
        if types:
            types = checks.names(types, "jobTypes")
        target = (values.get("scaleTargetRef") or {}).get("name") or ""
        poll = checks.interval_seconds(values["pollIntervalSeconds"], "pollIntervalSeconds")
        per = values.get("jobsPerReplica")
        per = checks.whole(per, "jobsPerReplica", 1) if per is not None else None
        paused = values.get("paused", False)
        if not isinstance(paused, bool):
            raise ValueError(f"paused must be true or false, not {paused!r}")
        return cls(target, list(types) if types else None, limits, poll, paused, per)


@dataclass
class PoolState:
    """What one pool's loop carries from poll to poll."""

    memory: ScaleMemory = field(default_factory=ScaleMemory)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    paused: tuple[str, ...] = ()
    """The paused types last reported, so that a pause is an Event once."""
    limited: tuple[str, ...] = ()
    """The types a limit held back last time, so that it is an Event once."""
    handled: tuple[str, ...] | None = None
    """The types live workers registered, remembered while none runs (None: never seen)."""
    template: str = ""
    """The target's pod template the handled types were seen with: a new one forgets them."""
    unhandled: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    held: bool = False
    """The pool was paused at the last poll, so that pausing is an Event once."""


def poll_once(
    kube: Kube,
    database_url: str,
    ref: ObjectRef,
    raw_spec: Mapping[str, Any],
    default_poll_seconds: float,
    state: PoolState,
    clock: Callable[[], float] = time.monotonic,
) -> float | None:
    """Measure, decide, scale and write the status; returns the seconds to the next
    poll, or None once the WorkerPool is gone (its loop then ends: a WorkerPool has
    no finalizer, so its deletion never waits for the operator)."""
    try:
        if not kube.exists(ref):
            return None
    except KubeError as exc:
        logger.warning("Cannot read %s/%s: %s", ref.namespace, ref.name, exc)
    try:
        spec = PoolSpec.parse(raw_spec, default_poll_seconds)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        _write(kube, ref, _failed(kube, ref, state, "InvalidSpec", f"spec: {exc}"))
        return default_poll_seconds
    try:
        status = _reconcile(kube, database_url, ref, spec, state, clock())
    except RotaError as exc:
        status = _failed(
            kube, ref, state, "DatabaseUnavailable", f"cannot measure the queue: {exc}"
        )
    except KubeError as exc:
        reason = "TargetNotFound" if exc.not_found else "KubernetesError"
        status = _failed(kube, ref, state, reason, f"deployment {spec.target}: {exc}")
    except ValueError as exc:  # e.g. minReplicas > maxReplicas that skipped the CRD's rule
        status = _failed(kube, ref, state, "InvalidSpec", str(exc))
    _write(kube, ref, status)
    return spec.poll_interval_seconds


def _write(kube: Kube, ref: ObjectRef, status: dict[str, Any]) -> None:
    try:
        kube.patch_status(ref, status)
    except KubeError as exc:
        logger.warning("Cannot write the status of %s/%s: %s", ref.namespace, ref.name, exc)
        metrics.record_error("workerpools", "StatusPatchFailed")


def _reconcile(
    kube: Kube, database_url: str, ref: ObjectRef, spec: PoolSpec, state: PoolState, now: float
) -> dict[str, Any]:
    limits = spec.limits
    if limits.min_replicas > limits.max_replicas:
        raise ValueError(f"minReplicas {limits.min_replicas} > maxReplicas {limits.max_replicas}")
    replicas = kube.read_replicas(ref.namespace, spec.target)
    pods = kube.pods(ref.namespace, replicas.selector)
    deployment = kube.read_deployment(ref.namespace, spec.target)
    conflicts = pool_inputs.other_controllers(kube, ref.namespace, ref.name, spec.target)
    cover = _coverage(database_url, spec, state, deployment)
    age = queue_status.queue_age(database_url, cover.counted)
    if cover.handled is not None and not spec.job_types:
        cover = _name_unhandled(database_url, cover, age.ready_jobs)
    # Only the target's own workers (a worker's host name is its pod's name): the
    # database also serves other Deployments, other releases and workers outside
    # Kubernetes, whose jobs no replica of the target holds.
    loads = [w for w in workers.loads(database_url, spec.job_types) if w.host in pods]
    per, source = pool_inputs.jobs_per_replica(
        spec.jobs_per_replica, deployment, (w.concurrency for w in loads)
    )
    limits = dataclasses.replace(limits, jobs_per_replica=per)
    sample = QueueSample(
        age.oldest_ready_age_seconds,
        age.ready_jobs,
        age.running_jobs,
        held_jobs=sum(w.running for w in loads),
        busy_replicas=len({w.host for w in loads if w.running}),
        slots_per_replica=max((w.concurrency for w in loads), default=1),
    )
    hold = "Paused" if spec.paused else "ConflictingController" if conflicts else None
    decision = decide(limits, replicas.spec, sample, state.memory, now, hold=hold)
    state.memory = decision.memory
    status: dict[str, Any] = {}
    if hold is None and _scale(kube, ref, spec, replicas, decision, pods, loads):
        status["lastScaleTime"] = now_rfc3339()
    metrics.record_replicas(f"{ref.namespace}/{ref.name}", decision.desired, replicas.status)
    message = decision.message + f"; {per} jobs per replica from {source}"
    message += pool_reports.report_types(kube, ref, state, age, cover)
    pool_reports.report_holds(kube, ref, state, spec.paused, tuple(conflicts))
    if conflicts:
        message = f"other controllers scale {spec.target}: {', '.join(conflicts)}; " + message
    reason = "ConflictingController" if conflicts else decision.reason
    state.conditions = with_condition(state.conditions, "Ready", not conflicts, reason, message)
    return {
        **status,
        "pausedTypes": list(age.paused_types),
        "limitedTypes": list(age.limited_types),
        "handledTypes": list(cover.handled or ()),
        "unhandledTypes": list(cover.unhandled),
        "conflictingControllers": list(conflicts),
        "currentReplicas": replicas.status,
        "desiredReplicas": decision.desired,
        "oldestReadyAgeSeconds": round(sample.oldest_ready_age_seconds, 3),
        "readyJobs": sample.ready_jobs,
        "runningJobs": sample.running_jobs,
        "busyReplicas": sample.busy_replicas,
        "minReplicasForRunningJobs": sample.floor,
        "jobsPerReplica": per,
        "maxReplicasForJobs": sample.cap(per),
        "decidedBy": decision.reason,
        "conditions": state.conditions,
    }


def _scale(
    kube: Kube,
    ref: ObjectRef,
    spec: PoolSpec,
    replicas: Replicas,
    decision: Decision,
    pods: Mapping[str, str | None],
    loads: list[workers.WorkerLoad],
) -> bool:
    """Apply a decision; True when the replicas changed."""
    if decision.desired < replicas.spec:
        # Busy pods cost their jobs, idle ones nothing, so the ReplicaSet stops
        # idle ones first (`loads` holds the workers of `pods` only).
        costs: dict[str, int] = {}
        for w in loads:
            costs[w.host] = costs.get(w.host, 0) + w.running
        kube.mark_deletion_costs(ref.namespace, pods, costs)
    if decision.desired == replicas.spec:
        return False
    kube.set_replicas(ref.namespace, spec.target, decision.desired)
    kube.post_event(ref, "Normal", "Scaled", decision.message)
    logger.info("WorkerPool %s/%s: %s", ref.namespace, ref.name, decision.message)
    return True


def _coverage(
    database_url: str, spec: PoolSpec, state: PoolState, deployment: Mapping[str, Any]
) -> pool_inputs.TypeCoverage:
    """The types to count: those the live workers registered, remembered for the
    target's current pod template while no worker runs."""
    template = json.dumps((deployment.get("spec") or {}).get("template"), sort_keys=True)
    if template != state.template:
        state.handled, state.template = None, template
    live = workers.live(database_url, shown=0)
    if live:
        state.handled = tuple(sorted({t for w in live for t in w.types}))
    return pool_inputs.coverage(spec.job_types, state.handled)


def _name_unhandled(
    database_url: str, cover: pool_inputs.TypeCoverage, counted_ready: int
) -> pool_inputs.TypeCoverage:
    """With no jobTypes, the types of due jobs that no live worker handles."""
    if queue_status.queue_age(database_url, None).ready_jobs <= counted_ready:
        return cover
    handled = set(cover.handled or ())
    types = queue_status.read_status(database_url).types
    unhandled = tuple(t for t, m in types.items() if m.due and not m.paused and t not in handled)
    return dataclasses.replace(cover, unhandled=unhandled)


MEASURES = (
    "oldestReadyAgeSeconds",
    "readyJobs",
    "runningJobs",
    "busyReplicas",
    "minReplicasForRunningJobs",
    "maxReplicasForJobs",
)
"""The status fields a poll measures: a failed poll measured none of them."""


def _failed(
    kube: Kube, ref: ObjectRef, state: PoolState, reason: str, message: str
) -> dict[str, Any]:
    """Ready=False and an error count; a Warning Event only when the failure is new.

    decidedBy names the failure and the last poll's measures are removed, so that
    `kubectl get workerpools` never shows an old queue age and rule as current ones.
    """
    logger.warning("WorkerPool %s/%s: %s", ref.namespace, ref.name, message)
    metrics.record_error("workerpools", reason)
    ready = next((c for c in state.conditions if c.get("type") == "Ready"), {})
    if (ready.get("status"), ready.get("reason")) != ("False", reason):
        kube.post_event(ref, "Warning", reason, message)
    state.conditions = with_condition(state.conditions, "Ready", False, reason, message)
    return {**dict.fromkeys(MEASURES), "decidedBy": reason, "conditions": state.conditions}
