"""The operator's only caller of the Kubernetes API (beside kopf's own watching).

It reads and sets a Deployment's replicas through the scale subresource (so
the operator needs no write access to Deployments themselves), lists the
Deployment's pods (their names tell which workers are its own) and marks them
with their cost of deletion (so a scale-down stops idle workers, not busy
ones), writes a WorkerPool's status, and posts Events.
Every call is synchronous and raises `KubeError` for an API failure, so no
other module imports `kubernetes`.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "rota-operator"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""The annotation a ReplicaSet reads when it scales down: lower costs go first."""


class KubeError(Exception):
    """The Kubernetes API refused or failed a call."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404


@dataclass(frozen=True)
class ObjectRef:
    """Which object an Event is about (the involvedObject)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class Replicas:
    """A Deployment's scale: what is asked (spec) and what runs (status)."""

    spec: int
    status: int
    selector: str = ""
    """The label selector of the Deployment's pods, as the scale reports it."""


def load_client() -> kubernetes.client.ApiClient:
    """An API client from the pod's service account, else from $KUBECONFIG (read now)."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or None, client_configuration=config
        )
    return kubernetes.client.ApiClient(config)


class Kube:
    """Typed, narrow access to the few API calls the operator makes."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)

    def read_replicas(self, namespace: str, deployment: str) -> Replicas:
        """The Deployment's scale (404 as KubeError when it does not exist)."""
        scale = _call(self.apps.read_namespaced_deployment_scale, deployment, namespace)
        spec, status = scale.get("spec") or {}, scale.get("status") or {}
        return Replicas(
            int(spec.get("replicas") or 0),
            int(status.get("replicas") or 0),
            str(status.get("selector") or ""),
        )

    def pods(self, namespace: str, selector: str) -> dict[str, str | None]:
        """The pods `selector` picks (none for an empty selector), each name with the
        cost of deletion it is annotated with now (None: not annotated)."""
        if not selector:
            return {}
        listed = _call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        found: dict[str, str | None] = {}
        for pod in listed.get("items") or ():
            meta = pod.get("metadata") or {}
            found[str(meta.get("name"))] = (meta.get("annotations") or {}).get(DELETION_COST)
        return found

    def mark_deletion_costs(
        self, namespace: str, pods: Mapping[str, str | None], costs: Mapping[str, int]
    ) -> int:
        """Annotate `pods` (as `pods()` listed them) with their cost of deletion (a
        pod named in `costs` gets its value, any other 0), so that a scale-down
        stops the cheapest pods first; returns the pods changed."""
        changed = 0
        for name, marked in pods.items():
            cost = str(costs.get(name, 0))
            if marked == cost:
                continue
            body = {"metadata": {"annotations": {DELETION_COST: cost}}}
            _call(self.core.patch_namespaced_pod, name, namespace, body, patch=True)
            changed += 1
        return changed

    def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        """Ask the Deployment for this many replicas."""
        body = {"spec": {"replicas": replicas}}
        _call(self.apps.patch_namespaced_deployment_scale, deployment, namespace, body, patch=True)

    def patch_status(self, ref: ObjectRef, status: dict[str, Any]) -> None:
        """Merge-patch a custom object's status subresource."""
        group, version = ref.api_version.split("/")
        plural = f"{ref.kind.lower()}s"
        body = {"status": status}
        api = self.custom.patch_namespaced_custom_object_status
        _call(api, group, version, ref.namespace, plural, ref.name, body, patch=True)

    def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Record an Event on the object; a failure is only logged (Events are advisory)."""
        try:
            _call(
                self.core.create_namespaced_event,
                ref.namespace,
                _event(ref, type_, reason, message),
            )
        except KubeError as exc:
            logger.warning(
                "Cannot post the event %s on %s/%s: %s", reason, ref.namespace, ref.name, exc
            )

    def exists(self, ref: ObjectRef) -> bool:
        """Whether the custom object is still there (False once it is deleted)."""
        group, version = ref.api_version.split("/")
        plural = f"{ref.kind.lower()}s"
        api = self.custom.get_namespaced_custom_object
        try:
            _call(api, group, version, ref.namespace, plural, ref.name)
        except KubeError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        """The Deployment itself (its pod template says how many jobs a worker runs)."""
        return _call(self.apps.read_namespaced_deployment, name, namespace)

    def list_objects(
        self, group: str, version: str, plural: str, namespace: str
    ) -> list[dict[str, Any]]:
        """The objects of a kind in a namespace, any API group (404 as KubeError when
        the kind is not served, e.g. KEDA's CRD is not installed)."""
        found = _call(self.custom.list_namespaced_custom_object, group, version, namespace, plural)
        return [dict(item) for item in found.get("items") or ()]

    def list_names(self, group: str, version: str, plural: str, namespace: str = "") -> list[str]:
        """Names of the custom objects of a kind (404 as KubeError when it is not served)."""
        if namespace:
            found = _call(
                self.custom.list_namespaced_custom_object, group, version, namespace, plural
            )
        else:
            found = _call(self.custom.list_cluster_custom_object, group, version, plural)
        items = found.get("items") or []
        return [str((item.get("metadata") or {}).get("name")) for item in items]


def _call(method: Any, *args: Any, patch: bool = False, **kwargs: Any) -> dict[str, Any]:
    """Call the client without its models (we need a few fields, not validation); JSON back."""
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": 30, **kwargs}
    if patch:
        options["_content_type"] = MERGE_PATCH
    try:
        response = method(*args, **options)
    except ApiException as exc:
        raise KubeError(exc.status or 0, _reason(exc)) from exc
    except OSError as exc:  # the API server cannot be reached
        raise KubeError(0, str(exc)) from exc
    data: bytes | None = response.data
    if not data:
        return {}
    return dict(json.loads(data))


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


def _event(ref: ObjectRef, type_: str, reason: str, message: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "namespace": ref.namespace,
            "name": ref.name,
            "uid": ref.uid,
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
