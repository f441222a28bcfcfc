"""HTTP probes and metrics: /healthz (the worker can still do work), /readyz (it can
reach the database and is not stopping), /metrics (Prometheus text format)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest

from rota.metrics import RUNS, MetricsSettings, serve_pages, worker_registry

if TYPE_CHECKING:
    from rota_worker.worker import Worker

log = logging.getLogger("rota.worker")

STALL_SECONDS = 60.0
"""/healthz fails when the claim loop has not turned for this long."""


class Probes:
    """What /healthz, /readyz and /metrics say about a worker."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def health(self) -> str | None:
        """None when healthy, else why /healthz fails."""
        w = self.worker
        if time.monotonic() - w.claims.last_tick >= STALL_SECONDS:
            return "stalled: the claim loop has not turned for a minute"
        overdue = w.leases.overdue()
        if overdue is not None:
            return overdue
        if not w.runner.healthy:
            return f"{w.runner.abandoned} handler threads are stuck (the concurrency)"
        return None

    def serve(self) -> ThreadingHTTPServer | None:
        w = self.worker
        if w.settings.metrics_port is None:
            return None
        RUNS.configure(MetricsSettings.from_env())
        RUNS.declare(w.types)
        registry = worker_registry(w.settings.concurrency, self._running_types)
        metrics = functools.partial(generate_latest, registry)
        return serve(w.settings.metrics_port, w.snapshot, self.health, metrics)

    def _running_types(self) -> list[str]:
        """The types of the jobs running now, read on the event loop (/metrics is
        served from a thread of its own)."""
        w = self.worker

        async def read() -> list[str]:
            return [record.job.type for record in w.attempts.running]

        loop = w._loop
        if loop is None or loop.is_closed():
            return []
        try:
            return asyncio.run_coroutine_threadsafe(read(), loop).result(timeout=2.0)
        except (TimeoutError, RuntimeError, CancelledError):
            return []  # stopping, or the loop is stuck (then /healthz says so)


def serve(
    port: int,
    snapshot: Callable[[], dict[str, Any]],
    health: Callable[[], str | None],
    metrics: Callable[[], bytes],
    host: str = "0.0.0.0",
) -> ThreadingHTTPServer:
    """`health` returns None when healthy, else why not (the body of the 503)."""

    def healthz() -> tuple[int, bytes, str]:
        problem = health()
        body = b"ok\n" if problem is None else f"{problem}\n".encode()
        return 200 if problem is None else 503, body, "text/plain"

    def readyz() -> tuple[int, bytes, str]:
        ready = bool(snapshot()["ready"])
        return 200 if ready else 503, b"ready\n" if ready else b"not ready\n", "text/plain"

    def page() -> tuple[int, bytes, str]:
        return 200, metrics(), "text/plain; version=0.0.4; charset=utf-8"

    pages = {"/healthz": healthz, "/readyz": readyz, "/metrics": page}
    server = serve_pages(
        host, port, pages, "rota-probes", what="the worker's probes", option="metrics port"
    )
    log.info("serving /metrics, /healthz and /readyz on port %d", port)
    return server
