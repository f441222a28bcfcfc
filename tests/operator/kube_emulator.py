"""A Kubernetes API emulator good enough for kopf: kmock's, with what it lacks.

kmock's KubernetesEmulator keeps objects in memory and serves discovery, but as
shipped kopf cannot run against it. This subclass serves every object request
itself and adds what kopf and the kubernetes client rely on:

- a namespaced object gets its namespace from the URL;
- metadata.uid, generation, creationTimestamp and resourceVersion are filled in,
  resourceVersion changes on every write, generation on every spec change, and
  generateName makes a name (Events are posted that way);
- JSON-patch requests (kopf's finalizer edits, guarded by a "test" of the
  resourceVersion) are applied, and a failed test is 422, not 500;
- creating a CRD makes its resource discoverable, with its subresources;
- lists carry kind and apiVersion; watches are served as application/json,
  start after the resourceVersion asked for (kopf lists first, then watches),
  and no event between the snapshot and the stream is lost;
- deployments/scale is an autoscaling/v1 Scale (read and merge-patch), its
  status.selector made of the Deployment's matchLabels;
- lists honour a labelSelector of equalities (pods are stored, never run);
- /api/v1/namespaces, which kmock's URL parser cannot read, lists the
  namespaces of `self.namespaces` (kopf looks there when it is told which
  namespaces to watch); its watch stays open and quiet.

There is no controller behind it: a test plays the Deployment controller by
patching status itself.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import json
import uuid
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import enums, rendering

_versions = itertools.count(1000)

BUILTIN: dict[str, kmock.ResourceInfo] = {
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True),
    "v1/pods": kmock.ResourceInfo(kind="Pod", namespaced=True),
    "v1/secrets": kmock.ResourceInfo(kind="Secret", namespaced=True),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment", namespaced=True, subresources={"status", "scale"}
    ),
    "autoscaling/v1/horizontalpodautoscalers": kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler", namespaced=True
    ),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False
    ),
}


def _error(status: int, reason: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details={})


NAMESPACES_PATH = "/api/v1/namespaces"


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator with the fixes listed in the module's docstring."""

    namespaces: set[str] = attrs.field(factory=lambda: {"default"})

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path.rstrip("/") != NAMESPACES_PATH or raw_request.method != "GET":
            return await super().__call__(raw_request)
        if raw_request.query.get("watch") == "true":
            return await self._quiet_watch(raw_request)
        items = [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "resourceVersion": "1"},
            }
            for name in sorted(self.namespaces)
        ]
        version = {"resourceVersion": str(next(_versions))}
        body = {"kind": "NamespaceList", "apiVersion": "v1", "metadata": version, "items": items}
        return aiohttp.web.json_response(body)

    async def _quiet_watch(
        self, raw_request: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw_request)
        while raw_request.transport is not None and not raw_request.transport.is_closing():
            await asyncio.sleep(0.2)
        return response

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, info in BUILTIN.items():
            self.resources[key] = info
        self.resources["v1/events"].verbs = {"create", "list", "watch", "get"}

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or res.plural is None or request.action is None:
            return await super()._handle(request)  # discovery, /version, ...
        try:
            if request.action == enums.action.WATCH:
                return await self._watch(request)
            async with self._lock:
                payload = await self._serve(request)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        return aiohttp.web.json_response(payload)

    async def _serve(self, request: rendering.Request) -> dict[str, Any]:
        action = request.action
        if action == enums.action.LIST:
            return self._list(request)
        if action == enums.action.FETCH:
            return self._view(request, self._get(request))
        if action == enums.action.CREATE:
            return await self._create(request)
        if action == enums.action.UPDATE:
            return await self._patch(request)
        if action == enums.action.DELETE:
            return await self._delete(request)
        raise _error(405, "MethodNotAllowed", f"{request.method} is not emulated")

    # Reading.

    def _key(self, request: rendering.Request, name: str | None = None) -> Any:
        return (request.resource, request.namespace, name or request.name)

    def _get(self, request: rendering.Request) -> dict[str, Any]:
        key = self._key(request)
        if key not in self._objects or self._objects[key].deleted:
            raise _error(404, "NotFound", f"{request.resource.plural} {request.name!r} not found")  # type: ignore[union-attr]
        return copy.deepcopy(self._objects[key].raw)

    def _list(self, request: rendering.Request) -> dict[str, Any]:
        res = request.resource
        assert res is not None
        wanted = _labels(request.params.get("labelSelector") or "")
        items = [
            copy.deepcopy(obj.raw)
            for (r, ns, _), obj in self._objects.items()
            if r == res
            and not obj.deleted
            and request.namespace in (None, ns)
            and wanted.items() <= ((obj.raw.get("metadata") or {}).get("labels") or {}).items()
        ]
        kind = self.resources[res].kind or res.plural
        api_version = f"{res.group}/{res.version}" if res.group else res.version
        version = str(next(_versions))
        return {
            "kind": f"{kind}List",
            "apiVersion": api_version,
            "metadata": {"resourceVersion": version},
            "items": items,
        }

    def _view(self, request: rendering.Request, obj: dict[str, Any]) -> dict[str, Any]:
        if request.subresource == "scale":
            return _scale_of(obj)
        return obj

    # Writing.

    async def _create(self, request: rendering.Request) -> dict[str, Any]:
        obj = copy.deepcopy(request.data or {})
        meta = obj.setdefault("metadata", {})
        if request.namespace and self.resources[request.resource].namespaced is not False:  # type: ignore[index]
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        key = (request.resource, meta.get("namespace"), meta.get("name"))
        if key in self._objects and not self._objects[key].deleted:
            raise _error(409, "AlreadyExists", f"{meta.get('name')!r} already exists")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=now)
        meta["resourceVersion"] = str(next(_versions))
        if key in self._objects:
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        if request.resource == kmock.resource("apiextensions.k8s.io/v1/customresourcedefinitions"):
            self._discover(obj)
        await self._buses[request.resource].put({"type": "ADDED", "object": copy.deepcopy(obj)})  # type: ignore[index]
        return obj

    async def _patch(self, request: rendering.Request) -> dict[str, Any]:
        old = self._get(request)
        changes = request.data
        if request.subresource == "scale":
            replicas = (changes or {}).get("spec", {}).get("replicas")
            changes = {"spec": {"replicas": replicas}}
        if "json-patch" in request.headers.get("Content-Type", ""):
            new = _json_patched(old, changes)
        else:
            new = _merge_patched(old, changes or {})
        if request.subresource == "status":
            new = {**old, "status": new.get("status")}
        new["metadata"]["resourceVersion"] = str(next(_versions))
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        self._objects[self._key(request)].create(new)
        await self._publish(request, new)
        return self._view(request, new)

    async def _delete(self, request: rendering.Request) -> dict[str, Any]:
        obj = self._get(request)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = datetime.datetime.now(
                    datetime.UTC
                ).isoformat()
                obj["metadata"]["resourceVersion"] = str(next(_versions))
                self._objects[self._key(request)].create(obj)
                await self._buses[request.resource].put(
                    {"type": "MODIFIED", "object": copy.deepcopy(obj)}
                )  # type: ignore[index]
            return obj
        self._objects[self._key(request)].delete()
        await self._buses[request.resource].put({"type": "DELETED", "object": copy.deepcopy(obj)})  # type: ignore[index]
        return obj

    async def _publish(self, request: rendering.Request, obj: dict[str, Any]) -> None:
        """MODIFIED, or DELETED when the last finalizer of a deleted object is gone."""
        bus = self._buses[request.resource]  # type: ignore[index]
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._objects[self._key(request)].delete()
            await bus.put({"type": "DELETED", "object": copy.deepcopy(obj)})
        else:
            await bus.put({"type": "MODIFIED", "object": copy.deepcopy(obj)})

    def _discover(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            info = self.resources[f"{spec['group']}/{version['name']}/{spec['names']['plural']}"]
            info.kind = spec["names"]["kind"]
            info.singular = spec["names"].get("singular")
            info.namespaced = spec.get("scope") == "Namespaced"
            info.shortnames = set(spec["names"].get("shortNames", []))
            info.categories = set(spec["names"].get("categories", []))
            info.subresources = set(version.get("subresources", {}))
            info.verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}

    # Watching.

    async def _watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        assert request.resource is not None and request._raw_request is not None
        bus = self._buses[request.resource]
        async with self._lock:
            marker = await bus.mark()
            since = int(request.params.get("resourceVersion") or 0)
            snapshot = [
                {"type": "ADDED", "object": copy.deepcopy(obj.raw)}
                for (r, ns, _), obj in self._objects.items()
                if r == request.resource and not obj.deleted and request.namespace in (None, ns)
                if int(obj.raw["metadata"]["resourceVersion"]) > since
            ]
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        try:
            for event in snapshot:
                await response.write(json.dumps(event).encode() + b"\n")
            async for event in bus.stream(since=marker):
                if request.namespace in (None, event["object"]["metadata"].get("namespace")):
                    await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            await bus.unmark(marker)
        return response


def _json_patched(obj: dict[str, Any], ops: Any) -> dict[str, Any]:
    try:
        return jsonpatch.apply_patch(obj, ops)  # type: ignore[no-any-return]
    except jsonpatch.JsonPatchTestFailed as exc:
        raise _error(422, "Invalid", f"the patch's test failed: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise _error(422, "Invalid", f"the patch cannot be applied: {exc}") from exc


def _merge_patched(obj: Any, patch: Any) -> Any:
    """RFC 7386 merge patch: dicts merge, None removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(obj) if isinstance(obj, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patched(result.get(key), value)
    return result


def _labels(selector: str) -> dict[str, str]:
    """A selector of equalities, "app=a,tier=b", as a dict (all the operator sends)."""
    return dict(part.split("=", 1) for part in selector.split(",") if part)  # type: ignore[misc]


def _scale_of(deployment: dict[str, Any]) -> dict[str, Any]:
    meta = deployment["metadata"]
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
        "spec": {"replicas": (deployment.get("spec") or {}).get("replicas", 1)},
        "status": {
            "replicas": (deployment.get("status") or {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }
