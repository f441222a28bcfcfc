"""`rota exporter`: the queue-wide measures on /metrics, for installs without the operator.

Workers serve only what they did themselves; the queue-wide figures (jobs by
status, queue age, dead letters, missed slots, live workers) come from one
process per installation: the operator when it runs, else this command. Any
number of exporters may run: only the one holding the database's exporter lock
serves the figures (`rota.metrics.QueueCollector`), so they never count twice.
A database away at start is waited for while serving (each scrape tries it
again); a connection option libpq refuses is bad input, exit 2 before serving.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from rota import limits
from rota.cli.common import UsageError, address, database_url, decimal, whole_number
from rota.cli.exits import one_line
from rota.db import check_options
from rota.metrics import MetricsSettings, metrics_page, queue_registry, serve_pages

log = logging.getLogger("rota")


def register(sub: Any) -> None:
    p = sub.add_parser("exporter", help="serve the queue-wide measures on /metrics")
    p.add_argument(
        "--host", type=address, default="0.0.0.0", help="address to listen on (default 0.0.0.0)"
    )
    p.add_argument(
        "--port", type=whole_number, default=9091, help="port to listen on (default 9091)"
    )
    p.add_argument(
        "--cache",
        type=decimal,
        default=5.0,
        metavar="SECONDS",
        help="scrapes within this many seconds share one read of the database (default 5)",
    )
    p.set_defaults(func=cmd_exporter)


def cmd_exporter(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0-65535, not {args.port}")
    if args.cache < 0:
        raise UsageError(f"--cache must be 0 or more seconds, not {args.cache}")
    if args.cache > limits.MAX_SECONDS:  # 1e400 reads as inf: figures never read again
        raise UsageError(
            f"--cache must be at most {limits.MAX_SECONDS:.0f} seconds (ten years),"
            f" not {args.cache}"
        )
    dsn = database_url()
    if failure := check_options(dsn):
        log.warning("waiting for the database (%s); serving meanwhile", one_line(failure))
    registry = queue_registry(dsn, cache_seconds=args.cache, settings=MetricsSettings.from_env())
    pages = {"/metrics": metrics_page(registry), "/healthz": lambda: (200, b"ok\n", "text/plain")}
    server = serve_pages(
        args.host, args.port, pages, "rota-exporter", what="the exporter", option="--port or --host"
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("exporter: serving the queue-wide measures on port %d", server.server_address[1])
    stop.wait()
    server.shutdown()
    return 0
