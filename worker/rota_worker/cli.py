"""`rota worker` and `rota demo`: the worker package's commands.

Registered with the core's CLI through the ``rota.commands`` entry point group,
so the core never imports the worker. Input is checked by `WorkerSettings`, the
same checks a worker built in Python passes.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
import time
from typing import Any

from rota import handlers, limits
from rota.cli import timeouts
from rota.cli.common import (
    UsageError,
    checked,
    database_url,
    decimal,
    port_number,
    positive_int,
)
from rota.cli.exits import one_line
from rota.db import check_options, connect
from rota.errors import DatabaseUnavailable, MigrationError, RotaError
from rota.handlers import check_served
from rota.migrate import require_current
from rota.settings import ConnectionSettings

log = logging.getLogger("rota_worker")


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
    p.add_argument(
        "--django",
        action="store_true",
        help="run the Django project's tasks (DJANGO_SETTINGS_MODULE; TASKS with"
        " rota.contrib.django.RotaBackend); the database is Django's unless"
        " ROTA_DATABASE_URL is set",
    )
    p.add_argument("--types", help="comma-separated job types to claim (default: all handled)")
    p.add_argument("--concurrency", type=positive_int, default=10)
    p.add_argument(
        "--lease", type=checked(decimal, limits.lease_seconds), default=30.0, metavar="SECONDS"
    )
    p.add_argument(
        "--grace-period",
        type=checked(decimal, limits.delay_seconds),
        default=25.0,
        metavar="SECONDS",
    )
    p.add_argument(
        "--poll-interval",
        type=checked(decimal, limits.interval_seconds),
        default=1.0,
        metavar="SECONDS",
    )
    p.add_argument(
        "--job-timeout",
        type=decimal,
        metavar="SECONDS",
        help="time limit of an attempt whose job and handler set none (default: none)",
    )
    p.add_argument(
        "--isolation",
        choices=["thread", "process"],
        default="thread",
        help="run sync handlers in threads (default) or in child processes that can be killed",
    )
    p.add_argument(
        "--max-jobs-per-child",
        type=positive_int,
        metavar="N",
        help="with --isolation process: replace a child by a fresh one after N attempts"
        " (default: children live on)",
    )
    p.add_argument(
        "--max-child-memory",
        type=positive_int,
        metavar="MIB",
        help="with --isolation process: replace a child whose resident memory is past this"
        " many MiB after an attempt (Linux; default: no limit)",
    )
    p.add_argument(
        "--no-claim-ahead",
        action="store_true",
        help="claim only into free slots, never the next batch while short jobs run",
    )
    p.add_argument(
        "--no-eager-tasks",
        action="store_true",
        help="start every task on the event loop's next turn (Python 3.12+ starts"
        " an attempt's handler at once by default)",
    )
    p.add_argument("--no-scheduler", action="store_true")
    p.add_argument("--no-reaper", action="store_true")
    p.add_argument("--metrics-port", type=port_number, metavar="PORT")
    p.add_argument(
        "--loop-stall",
        type=checked(decimal, limits.interval_seconds),
        metavar="SECONDS",
        help="the event loop not turning for this long is a stall, logged and counted in"
        f" rota_worker_loop_stalls_total (default: {LOOP_STALL_ENV} or 1)",
    )
    p.add_argument(
        "--startup-wait",
        type=checked(decimal, limits.delay_seconds),
        default=STARTUP_WAIT_SECONDS,
        metavar="SECONDS",
        help="how long to wait at start for the database to answer with Rota's current"
        " schema before exiting with code 1 (a wrong URL, a database not yet up, or"
        f" not migrated; default {STARTUP_WAIT_SECONDS:g})",
    )
    timeouts.add_options(p, heartbeat=True)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("demo", help="Rota on an embedded PostgreSQL with sample jobs")
    p.add_argument(
        "--seconds",
        type=checked(decimal, limits.interval_seconds),
        help="stop after this long (default: Ctrl-C)",
    )
    p.add_argument(
        "--port",
        type=port_number,
        help="the console's port on 127.0.0.1 (default 8080, or a free one if it is taken;"
        " 0: any free one)",
    )
    p.set_defaults(func=cmd_demo)


LOOP_STALL_ENV = "ROTA_LOOP_STALL_SECONDS"
STARTUP_WAIT_SECONDS = 60.0


def _loop_stall(args: argparse.Namespace, default: float) -> float:
    parse = checked(decimal, limits.interval_seconds)
    seconds = timeouts.option_or_env(args.loop_stall, LOOP_STALL_ENV, parse)
    return default if seconds is None else float(seconds)


def load_handlers(modules: list[str]) -> None:
    """Import the modules that register handlers (and the built-in ones); refuse
    modules that register none, and a job type given two handlers."""
    clashes = len(handlers.replaced)
    _import(["rota.archive"])
    loaded = handlers.registered()
    _import(modules)
    if modules and handlers.registered() == loaded:
        raise UsageError(
            f"the handlers module(s) {', '.join(modules)} register no handler:"
            ' decorate the functions that run jobs with @rota.handler("job.type")'
        )
    if len(handlers.replaced) > clashes:
        old, new = handlers.replaced[clashes]
        raise UsageError(
            f"job type {new.type!r} has two handlers, {handlers.describe(old)} and"
            f" {handlers.describe(new)}: a type has one handler"
        )


def _import(modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            raise UsageError(f"cannot import handlers module {name!r}: {exc}") from None
        except Exception as exc:  # a SyntaxError, or the module raised as it ran
            raise UsageError(
                f"cannot import handlers module {name!r}: {type(exc).__name__}: {exc}"
            ) from None


def cmd_worker(args: argparse.Namespace) -> int:
    from rota_worker import Worker, WorkerSettings

    sys.path.insert(0, ".")
    types = _types(args.types)
    settings = WorkerSettings(
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        grace_period_seconds=args.grace_period,
        poll_interval_seconds=args.poll_interval,
        job_timeout_seconds=args.job_timeout,
        isolation=args.isolation,
        max_jobs_per_child=args.max_jobs_per_child,
        max_child_memory_mb=args.max_child_memory,
        handler_modules=args.handlers,
        types=types,
        run_reaper=not args.no_reaper,
        run_scheduler=not args.no_scheduler,
        metrics_port=args.metrics_port,
        claim_ahead=not args.no_claim_ahead,
        eager_tasks=not args.no_eager_tasks,
        connection=timeouts.settings(args),
        loop_stall_seconds=_loop_stall(args, WorkerSettings.loop_stall_seconds),
    )
    dsn = database_url()
    if args.django:
        if args.isolation == "process":
            raise UsageError("--django runs tasks in threads: leave out --isolation process")
        django_dsn = _django()  # before the handler modules: they may use its models
        dsn = dsn or django_dsn
    load_handlers(args.handlers)
    if types is not None:
        check_served(types)
    wait_for_database(dsn, settings.connection, args.startup_wait)
    worker = Worker(dsn, settings)
    worker.run(install_signals=True)
    if worker.left_behind or any(t.is_alive() and not t.daemon for t in threading.enumerate()[1:]):
        # Handlers still running past the grace period were given back; their
        # threads cannot be interrupted, nor an async handler that swallows its
        # cancellation, and they must not hold the exit.
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
    return 0


def _types(option: str | None) -> list[str] | None:
    """The job types of `--types a,b` (None: every handled type)."""
    if option is None:
        return None
    types = [t.strip() for t in option.split(",") if t.strip()]
    if not types:
        raise UsageError(
            f"--types names no job type ({option!r}): give a comma-separated list, or leave"
            " it out to claim every type with a handler"
        )
    return types


def wait_for_database(dsn: str, connection: ConnectionSettings, seconds: float) -> None:
    """Return once the database answers with Rota's current schema; after `seconds`
    of trying, a `RotaError` that says why (`rota` exits 1): a wrong URL or an
    unmigrated database must not look like a worker that hangs. An option libpq
    refuses is not waited for: `ConnectionOptionRefused` at once (exit 2)."""
    deadline = time.monotonic() + seconds
    # The URL as given, which the connections below override with the timeouts'
    # options (a connect_timeout=abc of the URL would otherwise pass here).
    check_options(dsn)
    while True:
        try:
            with connect(dsn, **connection.libpq(dsn)) as conn:
                require_current(conn)
            return
        except (DatabaseUnavailable, MigrationError) as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RotaError(
                    f"gave up after {seconds:g}s waiting for the database (--startup-wait): {exc}"
                ) from None
            log.warning("waiting for the database (%s); giving up in %.0fs", one_line(exc), left)
            time.sleep(min(2.0, left))


def _django() -> str:
    """Set the Django project up and register its task queues' handlers; the URL of
    its database."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise UsageError("--django needs DJANGO_SETTINGS_MODULE (the project's settings module)")
    try:
        from rota.contrib.django import setup_worker
    except ImportError as exc:
        raise UsageError(f"--django needs Django 6 (pip install 'rota[django]'): {exc}") from None
    _, dsn = setup_worker()
    _one_line_per_log_record()
    return dsn


def _one_line_per_log_record() -> None:
    """Django's default logging (DEBUG on, as `startproject` leaves it) gives its
    `django` logger a console handler of its own, whose records also reach the
    root's handler: each line printed twice. The root's handler (`rota
    --log-format`) prints them once."""
    django_logger = logging.getLogger("django")
    django_logger.handlers = [
        h for h in django_logger.handlers if type(h) is not logging.StreamHandler
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    from rota_worker import demo

    demo.check_can_run(args.port)
    return demo.run_demo(seconds=args.seconds, port=args.port)
