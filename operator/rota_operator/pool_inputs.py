"""What a WorkerPool learns beside its queue before it decides.

- how many jobs one replica runs (`jobs_per_replica`): the spec, else the
  target's `--concurrency`, else what its workers registered, else 1;
- which types the live workers handle (`TypeCoverage`): jobs of a type that no
  registered worker handles are not counted, and are named;
- who else scales the same target (`other_controllers`): another WorkerPool,
  a HorizontalPodAutoscaler, a KEDA ScaledObject. Two controllers on one
  Deployment undo each other's decisions; the pool stands aside and says so.

The parsing functions are pure; the two that call an API say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rota_operator.kube import Kube, KubeError

WORKER_DEFAULT_CONCURRENCY = 10
"""`rota worker`'s --concurrency when none is given (rota_worker.cli)."""

SCALERS: tuple[tuple[str, str, str, str], ...] = (
    ("rota.dev", "v1", "workerpools", "WorkerPool"),
    ("autoscaling", "v1", "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
    ("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject"),
)
"""The kinds that set a Deployment's replicas, as (group, version, plural, kind)."""


def concurrency_of(deployment: Mapping[str, Any]) -> int | None:
    """The jobs per replica a Deployment's worker containers run, read from their
    command line; None when no container runs `rota worker` or says --concurrency."""
    template = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in template.get("containers") or ():
        words = [str(w) for w in (container.get("command") or [])]
        words += [str(w) for w in (container.get("args") or [])]
        for i, word in enumerate(words):
            if word.startswith("--concurrency="):
                return _positive(word.split("=", 1)[1])
            if word == "--concurrency" and i + 1 < len(words):
                return _positive(words[i + 1])
        if "worker" in words[:2] and any(w.endswith("rota") for w in words[:1]):
            return WORKER_DEFAULT_CONCURRENCY
    return None


def _positive(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def jobs_per_replica(
    spec_value: int | None, deployment: Mapping[str, Any], registered: Iterable[int]
) -> tuple[int, str]:
    """The jobs per replica and where the number came from."""
    if spec_value:
        return spec_value, "spec.jobsPerReplica"
    found = concurrency_of(deployment)
    if found:
        return found, "the target's --concurrency"
    seen = max(registered, default=0)
    if seen:
        return seen, "the concurrency its workers registered"
    return 1, "unknown (1 assumed)"


@dataclass(frozen=True)
class TypeCoverage:
    """Which job types to count, and which are left out because no worker handles them."""

    counted: list[str] | None
    """The types to measure (None: every type, as before any worker registered)."""
    handled: tuple[str, ...] | None
    """The types live workers registered (None: none ever seen)."""
    unhandled: tuple[str, ...] = ()


def coverage(job_types: Sequence[str] | None, handled: Sequence[str] | None) -> TypeCoverage:
    """The pool's types narrowed to those handled. With no jobTypes, the handled
    types themselves; with no worker ever seen, nothing is narrowed."""
    if handled is None:
        return TypeCoverage(list(job_types) if job_types else None, None)
    known = tuple(sorted(set(handled)))
    if not job_types:
        return TypeCoverage(list(known), known)
    counted = [t for t in job_types if t in known]
    return TypeCoverage(counted, known, tuple(sorted(set(job_types) - set(known))))


def other_controllers(kube: Kube, namespace: str, pool: str, target: str) -> list[str]:
    """Other objects that scale `target` in `namespace`, as "Kind/name" (calls the API).

    A kind that is not served (no KEDA in the cluster, or an RBAC refusal of an
    optional kind) is skipped: only what can be seen is reported."""
    found = []
    for group, version, plural, kind in SCALERS:
        try:
            items = kube.list_objects(group, version, plural, namespace)
        except KubeError as exc:
            if exc.not_found or exc.status == 403:
                continue
            raise
        for item in items:
            name = str((item.get("metadata") or {}).get("name"))
            if kind == "WorkerPool" and name == pool:
                continue
            if _targets(item, kind, target):
                found.append(f"{kind}/{name}")
    return sorted(found)


def _targets(item: Mapping[str, Any], kind: str, target: str) -> bool:
    ref = (item.get("spec") or {}).get("scaleTargetRef") or {}
    if ref.get("name") != target:
        return False
    return kind == "WorkerPool" or ref.get("kind", "Deployment") == "Deployment"
