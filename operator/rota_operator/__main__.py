"""`rota-operator`: run the kopf operator with Rota's handlers and the environment's settings.

A connection option libpq refuses (in ROTA_DATABASE_URL or a PG* variable)
stops it at start, exit 2 with one line on stderr, as it stops every
long-running `rota` command: no retry mends it. A database away at start is
retried object by object, as ever (`rota_operator.handlers`).

Without ROTA_STANDALONE, peering is mandatory: kopf keeps the operator paused,
handling nothing and saying nothing at the default level, until its peering
CRDs and the peering object exist. So the operator says it, at start and then
every ROTA_PEERING_WAIT_LOG_SECONDS (30) while it waits, with the two ways out.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import kopf

from rota.cli import exits
from rota.db import check_options
from rota.errors import ConnectionOptionRefused
from rota_operator import handlers as _handlers  # noqa: F401 - registers the handlers
from rota_operator import kube
from rota_operator.settings import Settings

logger = logging.getLogger("rota_operator.peering")

PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"
_HOW_TO = (
    "install kopf's peering CRDs from crds/kopf/ and the peering object (the Helm chart"
    " does both with operator.peering.enabled=true), or run a single replica with"
    " ROTA_STANDALONE=true"
)

CRD_GROUP = "apiextensions.k8s.io"
"""Where the peering CRDs are looked for (kopf's own grants let it list them)."""


def peering_wait_reason(api: kube.Kube, settings: Settings) -> str | None:
    """Why kopf's mandatory peering keeps this operator paused; None when nothing is missing."""
    if settings.namespaces:
        plural, kind = "kopfpeerings", "KopfPeering"
        places = [ns for ns in settings.namespaces if not any(c in ns for c in "*?[!")]
    else:
        plural, kind, places = "clusterkopfpeerings", "ClusterKopfPeering", [""]
    crd = f"{plural}.{PEERING_GROUP}"
    try:
        if crd not in api.list_names(CRD_GROUP, "v1", "customresourcedefinitions"):
            return f"the CRD {crd} is not installed"
        for namespace in places:
            names = api.list_names(PEERING_GROUP, PEERING_VERSION, plural, namespace)
            if settings.peering_name not in names:
                where = f" in namespace {namespace}" if namespace else ""
                return f"there is no {kind} named {settings.peering_name!r}{where}"
    except kube.KubeError as exc:
        if exc.not_found:
            return f"the CRD {crd} is not installed"
        return f"cannot list {crd} or its CRD: {exc}"
    return None


async def report_peering_wait(api: kube.Kube, settings: Settings, interval: float) -> None:
    """Log a warning at once and every `interval` seconds while peering is missing."""
    waited = 0.0
    while True:
        reason = await asyncio.to_thread(peering_wait_reason, api, settings)
        if reason is None:
            if waited:
                logger.warning("Peering found after %.0f s: the operator goes on.", waited)
            else:
                logger.info("Peering %r is in place.", settings.peering_name)
            return
        logger.warning(
            "The operator is paused and handles nothing%s: peering is mandatory without"
            " ROTA_STANDALONE, and %s. To go on, %s.",
            f" (for {waited:.0f} s now)" if waited else "",
            reason,
            _HOW_TO,
        )
        await asyncio.sleep(interval)
        waited += interval


@kopf.on.startup()
async def watch_peering(memo: kopf.Memo, **_: Any) -> None:
    """Start the peering report (only `rota-operator` makes peering mandatory)."""
    settings = Settings.from_environ()
    if settings.standalone:
        logger.info("Standalone: no peering (a single replica).")
        return
    api = kube.Kube(await asyncio.to_thread(kube.load_client))
    memo.peering_report = asyncio.create_task(
        report_peering_wait(api, settings, settings.peering_wait_log_seconds)
    )


@kopf.on.cleanup()
async def stop_peering_report(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("peering_report")
    if task is not None:
        task.cancel()


def check_database_options(dsn: str) -> None:
    """Exit 2 with one line if libpq refuses the connection options of `dsn` (or of
    the PG* variables); any other outcome of the attempt is left to the handlers."""
    try:
        check_options(dsn)
    except ConnectionOptionRefused as exc:
        explained = exits.explain(exc, [])
        assert explained is not None
        code, line = explained
        print(f"rota-operator: {line}", file=sys.stderr)
        raise SystemExit(code) from None


def main() -> None:
    """Watch ROTA_NAMESPACES (or the whole cluster) until SIGTERM."""
    settings = Settings.from_environ()
    check_database_options(settings.database_url)
    kopf.configure(verbose=False)
    # A peering name makes peering mandatory: without the kopf.dev CRDs the replicas wait
    # (paused) instead of all acting at once. Standalone needs no name and no CRDs.
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.standalone,
        peering_name=None if settings.standalone else settings.peering_name,
    )


if __name__ == "__main__":
    main()
