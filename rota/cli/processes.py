"""Long-running commands: `rota worker`, `rota reaper`, `rota scheduler`, `rota demo`."""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import signal
import sys
import threading
from typing import Any

from rota.cli.common import UsageError, database_url, positive_int
from rota.errors import RotaError
from rota.migrate import require_current

log = logging.getLogger("rota")


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run jobs (and the reaper and scheduler) until SIGTERM")
    p.add_argument(
        "--handlers",
        nargs="+",
        action="extend",
        default=[],
        metavar="MODULE",
        help="modules that register handlers with @rota.handler",
    )
    p.add_argument("--types", help="comma-separated job types to claim (default: all handled)")
    p.add_argument("--concurrency", type=positive_int, default=10)
    p.add_argument("--lease", type=float, default=30.0, metavar="SECONDS")
    p.add_argument("--grace-period", type=float, default=25.0, metavar="SECONDS")
    p.add_argument("--poll-interval", type=float, default=1.0, metavar="SECONDS")
    p.add_argument("--no-scheduler", action="store_true")
    p.add_argument("--no-reaper", action="store_true")
    p.add_argument("--metrics-port", type=int, metavar="PORT")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("reaper", help="run only the reaper loop")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.set_defaults(func=cmd_reaper)

    p = sub.add_parser("scheduler", help="run only the scheduler loop")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.set_defaults(func=cmd_scheduler)

    p = sub.add_parser("demo", help="Rota on an embedded PostgreSQL with sample jobs")
    p.add_argument("--seconds", type=float, help="stop after this long (default: Ctrl-C)")
    p.set_defaults(func=cmd_demo)


def load_handlers(modules: list[str]) -> None:
    """Import the modules that register handlers (and the built-in ones)."""
    for name in ["rota.archive", *modules]:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            raise UsageError(f"cannot import handlers module {name!r}: {exc}") from None


def cmd_worker(args: argparse.Namespace) -> int:
    from rota.settings import ReaperSettings
    from rota_worker import Worker, WorkerSettings

    sys.path.insert(0, ".")
    load_handlers(args.handlers)
    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types else None
    if not (0 < args.lease < math.inf and 0 <= args.grace_period < math.inf) or not (
        0 < args.poll_interval < math.inf
    ):  # written so that nan is refused too
        raise UsageError("--lease and --poll-interval must be > 0, --grace-period >= 0")
    settings = WorkerSettings(
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        grace_period_seconds=args.grace_period,
        poll_interval_seconds=args.poll_interval,
        types=types,
        run_reaper=not args.no_reaper,
        run_scheduler=not args.no_scheduler,
        metrics_port=args.metrics_port,
        reaper=ReaperSettings(),
    )
    Worker(database_url(), settings).run(install_signals=True)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()[1:]):
        # Sync handlers still running past the grace period were given back;
        # their threads cannot be interrupted, and must not hold the exit.
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
    return 0


def _loop(service: Any, once: bool) -> int:
    dsn = database_url()
    require_current(dsn)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while True:
        try:
            result = service.run_once(dsn)
            if once or bool(getattr(result, "count", 0)):
                log.info("%s: %s", service.name, result)
        except RotaError as exc:
            if once:
                raise
            log.warning("%s failed: %s", service.name, exc)
        if once or stop.wait(service.interval_seconds):
            return 0


def cmd_reaper(args: argparse.Namespace) -> int:
    from rota.reaper import Reaper
    from rota.settings import ReaperSettings

    if not 0 < args.interval < math.inf:  # nan too
        raise UsageError("--interval must be > 0")
    return _loop(Reaper(ReaperSettings(interval_seconds=args.interval)), args.once)


def cmd_scheduler(args: argparse.Namespace) -> int:
    from rota.scheduler import Scheduler

    dsn = database_url()
    require_current(dsn)
    scheduler = Scheduler()
    if args.once:
        log.info("scheduler: %s", scheduler.run_once(dsn))
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    scheduler.run(dsn, stop)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rota_worker.demo import run_demo

    return run_demo(seconds=args.seconds)
