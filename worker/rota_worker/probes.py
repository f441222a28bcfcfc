"""HTTP probes and metrics: /healthz (the worker can still do work), /readyz (it can
reach the database and is not stopping), /metrics (Prometheus text format)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("rota.worker")


def serve(
    port: int,
    snapshot: Callable[[], dict[str, Any]],
    health: Callable[[], str | None],
    metrics: Callable[[], bytes],
    host: str = "0.0.0.0",
) -> ThreadingHTTPServer:
    """`health` returns None when healthy, else why not (the body of the 503)."""

    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                problem = health()
                body = b"ok\n" if problem is None else f"{problem}\n".encode()
                self._reply(200 if problem is None else 503, body)
            elif self.path == "/readyz":
                ready = bool(snapshot()["ready"])
                self._reply(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
            elif self.path == "/metrics":
                self._reply(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Probe)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="rota-probes", daemon=True).start()
    log.info("serving /metrics, /healthz and /readyz on port %d", port)
    return server
