"""`python -m rota_operator.signing_key`: make the console's signing key once.

The chart runs this as a hook Job before every install and upgrade (and Argo CD
before every sync). It creates the Secret holding the console's signing key
(ROTA_WEB_SECRET) when it does not exist, and otherwise leaves it alone, so the
key survives upgrades and re-renders without Helm's `lookup`, which GitOps tools
cannot run. A key found in the Secret of an earlier chart version
(`--copy-from`) is copied, so sessions survive the upgrade to this one too.

It runs with a Role of its own (get on the two Secrets, create on Secrets), not
with the operator's rights.
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

logger = logging.getLogger("rota_operator.signing_key")

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rota_operator.signing_key")
    parser.add_argument("name", help="the Secret to make once")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--key", default="secret", help="the key inside the Secret")
    parser.add_argument("--copy-from", default="", help="a Secret whose key to reuse")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    labels = dict(item.split("=", 1) for item in args.label if "=" in item)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    api = kubernetes.client.CoreV1Api(load_client())
    try:
        done = ensure(api, args.namespace, args.name, args.key, args.copy_from, labels)
    except ApiException as exc:
        logger.error("cannot make the Secret %s/%s: %s", args.namespace, args.name, exc.reason)
        return 1
    logger.info("Secret %s/%s: %s", args.namespace, args.name, done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
