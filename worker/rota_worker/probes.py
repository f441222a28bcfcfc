"""HTTP probes and metrics: /healthz (the worker can still do work), /readyz (it can
reach the database and is not stopping), /metrics (Prometheus text format)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from rota.metrics import serve_pages

log = logging.getLogger("rota.worker")


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
    server = serve_pages(host, port, pages, "rota-probes")
    log.info("serving /metrics, /healthz and /readyz on port %d", port)
    return server
