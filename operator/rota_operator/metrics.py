"""The operator's own measures on /metrics, and /healthz for the liveness probe.

The server runs on the operator's event loop, so a /healthz answer also says
that the loop is not stuck. Besides its own measures, the operator serves the
database measures (queue age, counts, dead letters, missed slots): it is the
one process that runs while a pool is scaled to zero, so alerts on a waiting
queue still have a source then. Those are read in a thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rota.metrics import DatabaseCollector

REGISTRY = CollectorRegistry(auto_describe=True)

WORKERPOOL_REPLICAS = Gauge(
    "rota_workerpool_replicas",
    "Replicas of a WorkerPool's Deployment: desired (decided) and current (running).",
    ["pool", "kind"],
    registry=REGISTRY,
)

RECONCILE_ERRORS = Counter(
    "rota_operator_reconcile_errors_total",
    "Reconciliations that failed and will be retried, by resource and reason.",
    ["resource", "reason"],
    registry=REGISTRY,
)


def record_replicas(pool: str, desired: int, current: int) -> None:
    WORKERPOOL_REPLICAS.labels(pool=pool, kind="desired").set(desired)
    WORKERPOOL_REPLICAS.labels(pool=pool, kind="current").set(current)


def forget_pool(pool: str) -> None:
    """Drop a deleted pool's series, so dashboards do not show it frozen."""
    for kind in ("desired", "current"):
        with contextlib.suppress(KeyError):
            WORKERPOOL_REPLICAS.remove(pool, kind)


def record_error(resource: str, reason: str) -> None:
    RECONCILE_ERRORS.labels(resource=resource, reason=reason).inc()


def serve_database_measures(dsn: str) -> None:
    """Serve the database measures of `rota.metrics` for `dsn` (replacing any earlier one)."""
    for collector in list(REGISTRY._collector_to_names):
        if isinstance(collector, DatabaseCollector):
            REGISTRY.unregister(collector)
    REGISTRY.register(DatabaseCollector(dsn))


async def _metrics(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(generate_latest, REGISTRY)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def serve(host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start the server; returns its runner (to stop it) and the port it got."""
    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server: Any = site._server
    sockets = server.sockets if server is not None else ()
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
