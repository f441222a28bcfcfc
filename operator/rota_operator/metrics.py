"""The operator's own measures on /metrics, and /healthz for the liveness probe.

The server runs on the operator's event loop, so a /healthz answer also says
that the loop is not stuck. Besides its own measures, the operator is the queue
exporter of its installation: it serves the queue-wide measures (queue age,
counts, dead letters, missed slots, live workers; `rota.metrics.QueueCollector`),
as the one process that runs while a pool is scaled to zero, so alerts on a
waiting queue still have a source then. Standby replicas (or a `rota exporter`
beside it) serve them only if they hold the database's exporter lock, so every
figure exists once. Those are read in a thread, never on the loop. No
`_created` series are served.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rota.metrics import MetricsSettings, QueueCollector

disable_created_metrics()

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


_database: list[QueueCollector] = []
"""The queue collector being served (at most one)."""


def serve_database_measures(dsn: str) -> None:
    """Serve the queue-wide measures of `rota.metrics` for `dsn` (replacing any earlier one)."""
    while _database:
        with contextlib.suppress(KeyError):  # already taken out of the registry
            REGISTRY.unregister(_database.pop())
    collector = QueueCollector(dsn, settings=MetricsSettings.from_env())
    REGISTRY.register(collector)
    _database.append(collector)


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
    addresses: list[Any] = list(runner.addresses)
    bound = addresses[0][1] if addresses else port
    return runner, int(bound)
