"""`rota reaper`, `rota scheduler` and `rota archive`: one background service alone.

Each runs its service through `rota.services.run_loop`, the same loop workers
run it in; `--once` (and `rota archive`, always) runs passes until nothing is
left for now, then exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from datetime import datetime
from typing import Any

from rota import db, limits
from rota.archive import Archiver, ArchiveResult, ArchiveSettings
from rota.cli import timeouts
from rota.cli.common import checked, database_url, decimal, parse_duration, whole_number
from rota.cli.exits import one_line
from rota.errors import DatabaseUnavailable, MigrationError
from rota.metrics import Page, serve_pages
from rota.migrate import require_current
from rota.reaper import Reaper, ReaperSettings
from rota.scheduler import Scheduler
from rota.services import Result, Service, run_loop

log = logging.getLogger("rota")


def register(sub: Any) -> None:
    p = sub.add_parser("reaper", help="run only the reaper loop")
    p.add_argument(
        "--interval",
        type=checked(decimal, limits.interval_seconds),
        default=5.0,
        metavar="SECONDS",
        help="seconds between passes (default 5)",
    )
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    _add_health_port(p)
    timeouts.add_options(p)
    p.set_defaults(func=cmd_reaper)

    p = sub.add_parser("scheduler", help="run only the scheduler loop")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    _add_health_port(p)
    timeouts.add_options(p)
    p.set_defaults(func=cmd_scheduler)

    p = sub.add_parser("archive", help="move finished jobs to rota.job_archive")
    p.add_argument("--older-than", help="retention of done jobs, e.g. 7d (default 7d)")
    p.add_argument(
        "--failed-older-than", help="retention of failed, dead and cancelled jobs (default 30d)"
    )
    p.add_argument(
        "--delete-archived-older-than",
        metavar="DURATION",
        help="also delete rows archived longer ago than this, e.g. 90d (default: keep them)",
    )
    timeouts.add_options(p)
    p.set_defaults(func=cmd_archive)


def _add_health_port(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--health-port",
        type=checked(whole_number, lambda v, name: limits.whole(v, name, 0, 65535)),
        metavar="PORT",
        help="serve /healthz (the process answers) and /readyz (the last pass worked) on PORT",
    )


class Watched(Service):
    """A service whose passes are recorded, for the probes of --health-port."""

    def __init__(self, inner: Service) -> None:
        self.inner = inner
        self.name = inner.name
        self.wake_channel = inner.wake_channel
        self.recovery_grace_seconds = inner.recovery_grace_seconds
        self.last_pass_ok = False

    @property
    def interval_seconds(self) -> float:
        return self.inner.interval_seconds

    def run_once(self, conn_or_dsn: db.ConnOrDsn, now: datetime | None = None) -> Result:
        self.last_pass_ok = False
        result = self.inner.run_once(conn_or_dsn, now)
        self.last_pass_ok = True
        return result

    def run_recovering(self, conn_or_dsn: db.ConnOrDsn, now: datetime | None = None) -> Result:
        self.last_pass_ok = False
        result = self.inner.run_recovering(conn_or_dsn, now)
        self.last_pass_ok = True
        return result

    def failed(self, exc: BaseException) -> None:
        # Connecting for the pass failed, or the pass did: not ready either way.
        self.last_pass_ok = False
        self.inner.failed(exc)

    def next_wait(self, conn: db.Conn) -> float:
        return self.inner.next_wait(conn)

    def pages(self) -> dict[str, Page]:
        def ready() -> tuple[int, bytes, str]:
            if self.last_pass_ok:
                return 200, b"ok\n", "text/plain"
            return 503, b"the last pass failed or none ran yet\n", "text/plain"

        return {"/healthz": lambda: (200, b"ok\n", "text/plain"), "/readyz": ready}


def _run(service: Service, args: argparse.Namespace) -> int:
    once = args.once
    connection = timeouts.settings(args)
    dsn = database_url()
    stop = threading.Event()
    if getattr(args, "health_port", None) is not None and not once:
        service = Watched(service)
        serve_pages(
            "0.0.0.0",
            args.health_port,
            service.pages(),
            f"rota-{service.name}-health",
            what=f"the {service.name}'s probes",
            option="--health-port",
        )
    away = False
    if once:
        require_current(dsn)
    else:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        away = _wait_until_usable(dsn, stop)
    run_loop(service, dsn, stop, once=once, connection=connection, away=away)
    return 0


def _wait_until_usable(dsn: str, stop: threading.Event) -> bool:
    """Like a worker, a service started before its database (or its migration)
    waits for it instead of exiting: 0.5 s doubling to 10 s between tries. An
    option libpq refuses is no outage: its `ConnectionOptionRefused` passes
    through, and the command exits 2 at once. True: it had to wait (the loop
    then starts as after failed passes: `rota.services.Recovery`)."""
    delay = 0.5
    waited = False
    while not stop.is_set():
        try:
            require_current(dsn)
            return waited
        except (DatabaseUnavailable, MigrationError) as exc:
            log.warning("waiting for the database (%s); next try in %.1fs", one_line(exc), delay)
            waited = True
            stop.wait(delay)
            delay = min(delay * 2, 10.0)
    return waited


def cmd_reaper(args: argparse.Namespace) -> int:
    return _run(Reaper(ReaperSettings(interval_seconds=args.interval)), args)


def cmd_scheduler(args: argparse.Namespace) -> int:
    return _run(Scheduler(), args)


def cmd_archive(args: argparse.Namespace) -> int:
    connection = timeouts.settings(args)
    defaults = ArchiveSettings()
    done = defaults.done_retention_seconds
    if args.older_than is not None:
        done = parse_duration(args.older_than, "--older-than")
    failed = max(defaults.failed_retention_seconds, done)
    if args.failed_older_than is not None:
        failed = parse_duration(args.failed_older_than, "--failed-older-than")
    archived = None
    if args.delete_archived_older_than is not None:
        archived = parse_duration(args.delete_archived_older_than, "--delete-archived-older-than")
    settings = ArchiveSettings(
        done_retention_seconds=done,
        failed_retention_seconds=failed,
        archive_retention_seconds=archived,
    )
    results = run_loop(
        Archiver(settings), database_url(), threading.Event(), once=True, connection=connection
    )
    moved = [r for r in results if isinstance(r, ArchiveResult)]
    total_done, total_failed = sum(r.done for r in moved), sum(r.failed for r in moved)
    print(f"archived {total_done} done and {total_failed} failed/dead jobs")
    if archived is not None:
        print(f"deleted {sum(r.deleted for r in moved)} archived jobs")
    if keys := sum(r.keys for r in moved):
        print(f"deleted {keys} expired unique keys")
    return 0
