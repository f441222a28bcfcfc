"""`python -m rota_operator.chart_hooks`: what the chart's hook Job does before
every install and upgrade (and Argo CD before every sync).

- `--signing-key NAME`: create the Secret holding the console's signing key
  (ROTA_WEB_SECRET) when it does not exist, and otherwise leave it alone, so the
  key survives upgrades and re-renders without Helm's `lookup`, which GitOps
  tools cannot run. A key found in the Secret of an earlier chart version
  (`--copy-from`) is copied, so sessions survive the upgrade to this one too.
- `--adopt group/version/plural/namespace/name`: an object an earlier chart
  version made as a Helm hook (the WorkerPool, the kopf peering objects) gets
  the release's ownership annotations and loses its hook ones, as if the
  release had made it. (Helm checks ownership before any hook runs, so the
  upgrade from such a version still needs `helm upgrade --take-ownership`.)

It runs with rights of its own (get and create on the key's Secret; get and
patch on the named objects), not with the operator's.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import secrets
import sys
from collections.abc import Sequence
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from rota_operator.kube import load_client

logger = logging.getLogger("rota_operator.chart_hooks")

KEEP = {"helm.sh/resource-policy": "keep"}
"""Helm never deletes the Secret (it is not part of the release anyway)."""


def _read(api: Any, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        response = api.read_namespaced_secret(name, namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(json.loads(response.data))


def ensure(
    api: Any,
    namespace: str,
    name: str,
    key: str,
    copy_from: str = "",
    labels: dict[str, str] | None = None,
) -> str:
    """Create the Secret unless it exists; say what was done: kept, copied or made."""
    if _read(api, namespace, name) is not None:
        return "kept"
    value, done = "", "made"
    old = _read(api, namespace, copy_from) if copy_from else None
    if old and (old.get("data") or {}).get(key):
        value, done = old["data"][key], "copied"
    if not value:
        value = base64.b64encode(secrets.token_urlsafe(36).encode()).decode()
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "labels": labels or {}, "annotations": KEEP},
        "data": {key: value},
    }
    try:
        api.create_namespaced_secret(namespace, body, _preload_content=False)
    except ApiException as exc:
        if exc.status != 409:  # made meanwhile by another run: keep that one
            raise
        return "kept"
    return done


HOOK_ANNOTATIONS = ("helm.sh/hook", "helm.sh/hook-weight", "helm.sh/hook-delete-policy")


def adopt(api: Any, release: str, release_namespace: str, target: str) -> str:
    """Give an earlier chart's hook object to the release; say what was done:
    absent, owned (already the release's) or adopted."""
    group, version, plural, namespace, name = target.split("/")
    try:
        if namespace:
            found = api.get_namespaced_custom_object(group, version, namespace, plural, name)
        else:
            found = api.get_cluster_custom_object(group, version, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return "absent"
        raise
    notes = (found.get("metadata") or {}).get("annotations") or {}
    if notes.get("meta.helm.sh/release-name") == release and not notes.get("helm.sh/hook"):
        return "owned"
    patch = {
        "metadata": {
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": release,
                "meta.helm.sh/release-namespace": release_namespace,
                **dict.fromkeys(HOOK_ANNOTATIONS),
            },
        }
    }
    if namespace:
        api.patch_namespaced_custom_object(group, version, namespace, plural, name, patch)
    else:
        api.patch_cluster_custom_object(group, version, plural, name, patch)
    return "adopted"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rota_operator.chart_hooks")
    parser.add_argument("--namespace", required=True, help="the release's namespace")
    parser.add_argument("--release", default="", help="the release's name (for --adopt)")
    parser.add_argument("--signing-key", default="", metavar="NAME", help="the Secret to make")
    parser.add_argument("--key", default="secret", help="the key inside the Secret")
    parser.add_argument("--copy-from", default="", help="a Secret whose key to reuse")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--adopt", action="append", default=[], metavar="G/V/PLURAL/NS/NAME")
    args = parser.parse_args(argv)
    labels = dict(item.split("=", 1) for item in args.label if "=" in item)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    client = load_client()
    try:
        if args.signing_key:
            api = kubernetes.client.CoreV1Api(client)
            done = ensure(api, args.namespace, args.signing_key, args.key, args.copy_from, labels)
            logger.info("Secret %s/%s: %s", args.namespace, args.signing_key, done)
        custom = kubernetes.client.CustomObjectsApi(client)
        for target in args.adopt:
            logger.info("%s: %s", target, adopt(custom, args.release, args.namespace, target))
    except ApiException as exc:
        logger.error("the chart's hook failed: %s %s", exc.status, exc.reason)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
