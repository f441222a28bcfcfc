"""Memory: a finished attempt is freed when its outcome is settled, not by the
garbage collector.

An attempt's task whose result was the attempt closed a reference cycle (the
task, the attempt, the worker's record of it, the record's task) for every
job: the job, its record, the task, its coroutine and context stayed alive
until a collection found them, and the collector ran far more often for it
(a tenth of the worker's CPU a job in a drain of no-op jobs).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

import rota
from rota.claim import Attempt
from rota.handlers import Handler
from rota.jobs import Job
from rota_worker.attempts import Execution
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker


@pytest.fixture
def garbage_kept() -> Iterator[list[object]]:
    """What the collector finds unreachable from here on, kept for the test to read."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def _async_noop(job: Job) -> int:
    await asyncio.sleep(0)
    return 1


def test_attempts_leave_no_cycle_behind(db_url: str, garbage_kept: list[object]) -> None:
    handlers = {
        "c.async": Handler("c.async", _async_noop, is_async=True, wants_context=False),
        "c.sync": Handler("c.sync", lambda job: None, is_async=False, wants_context=False),
    }
    worker = Worker(db_url, WorkerSettings(concurrency=4), handlers=handlers, services=[])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            rota.enqueue_many(conn, [rota.NewJob(t) for t in ("c.async", "c.sync") * 20])
            deadline = time.monotonic() + 60
            while conn.execute("SELECT count(*) FROM rota.job WHERE status <> 'done'").fetchone()[
                0
            ]:
                assert time.monotonic() < deadline, "the jobs were not done in time"
                time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(timeout=60)
    gc.collect()
    kept = sorted(
        {type(o).__name__ for o in garbage_kept if isinstance(o, Execution | Attempt | Job)}
    )
    assert kept == []
