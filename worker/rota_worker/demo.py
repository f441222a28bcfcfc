"""`rota demo`: Rota on an embedded PostgreSQL, with sample jobs and schedules.

Starts a throwaway server, migrates it, registers a few handlers (one flaky, one
poisonous, so retries and dead letters show), adds two schedules, runs a worker
in this process and redraws `rota status` until Ctrl-C (or --seconds).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from typing import Any

import rota
from rota import schedule_store
from rota.status import read_status, render, warnings
from rota.testing import EmbeddedPostgres
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker

log = logging.getLogger("rota.demo")


@rota.handler("demo.email")
async def send_email(job: rota.Job) -> None:
    await asyncio.sleep(random.uniform(0.05, 0.4))


@rota.handler("demo.flaky")
def flaky(job: rota.Job) -> None:
    """Fails its first two attempts, then succeeds: shows retries with backoff."""
    if job.attempts < 3:
        raise ConnectionResetError(f"upstream hung up (attempt {job.attempts})")


@rota.handler("demo.poison")
def poison(job: rota.Job) -> None:
    """Always fails: ends in the dead-letter list after max_attempts."""
    raise ValueError(f"cannot parse payload {job.payload!r}")


@rota.handler("demo.report")
def report(job: rota.Job) -> None:
    log.info("scheduled report for slot %s", job.slot)


def _seed(dsn: str) -> None:
    rota.enqueue_many(
        dsn,
        [rota.NewJob("demo.email", {"to": f"user{i}@example.com"}) for i in range(40)]
        + [rota.NewJob("demo.flaky", {"n": i}, max_attempts=5) for i in range(5)]
        + [rota.NewJob("demo.poison", {"n": i}, max_attempts=3) for i in range(2)]
        + [rota.NewJob("demo.email", {"later": True}, delay=20) for _ in range(10)],
    )
    schedule_store.upsert(
        dsn, schedule_store.ScheduleSpec("demo/every-minute", "demo.report", "* * * * *")
    )
    schedule_store.upsert(
        dsn,
        schedule_store.ScheduleSpec(
            "demo/berlin-quarter", "demo.report", "*/15 * * * *", timezone="Europe/Berlin"
        ),
    )


def _status(dsn: str) -> str:
    status = read_status(dsn)
    return render(status, warnings(status, 60.0, 10))


def run_demo(seconds: float | None = None, refresh: float = 2.0) -> int:
    # Retries and dead letters show in the table; their log lines would scroll it away.
    logging.getLogger("rota").setLevel(logging.ERROR)
    print("Starting an embedded PostgreSQL ...", flush=True)
    with EmbeddedPostgres() as pg:
        dsn = pg.url()
        rota.migrate(dsn)
        _seed(dsn)
        worker = Worker(dsn, WorkerSettings(concurrency=8, poll_interval_seconds=0.5))
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        started = time.monotonic()
        try:
            while seconds is None or time.monotonic() - started < seconds:
                _trickle(dsn)
                print("\033[2J\033[H" + _status(dsn), flush=True)
                print(f"Database: {dsn}   (Ctrl-C stops the demo)", flush=True)
                time.sleep(refresh)
        except KeyboardInterrupt:
            pass
        finally:
            worker.stop()
            thread.join(timeout=60)
        print(_status(dsn), flush=True)
    return 0


def _trickle(dsn: str) -> None:
    """Keep a little traffic flowing so the numbers move."""
    jobs: list[Any] = [
        rota.NewJob("demo.email", {"to": "trickle@example.com"})
        for _ in range(random.randint(1, 6))
    ]
    rota.enqueue_many(dsn, jobs)
