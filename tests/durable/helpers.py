"""What the durable-job tests share: a worker in this process and waits on rows."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from rota.handlers import Handler
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for


@contextlib.contextmanager
def running(
    db_url: str, handlers: dict[str, Handler], concurrency: int, **settings: Any
) -> Iterator[Worker]:
    """A worker of `handlers` in a thread of this process (no reaper, no scheduler:
    the tests run those passes themselves), stopped and joined at the end."""
    options = {"poll_interval_seconds": 0.2, **settings}
    chosen = WorkerSettings(
        concurrency=concurrency, run_reaper=False, run_scheduler=False, **options
    )
    worker = Worker(db_url, chosen, handlers=handlers)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        yield worker
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def handlers(**funcs: Callable[..., Any]) -> dict[str, Handler]:
    """Handlers taking a Context, by type (a type's dots written as underscores)."""
    made = {}
    for name, func in funcs.items():
        job_type = name.replace("_", ".")
        is_async = func.__code__.co_flags & 0x80 != 0  # CO_COROUTINE
        made[job_type] = Handler(job_type, func, is_async=bool(is_async), wants_context=True)
    return made


def row(conn: Any, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = conn.execute(
        "SELECT * FROM rota.job WHERE id = %s", (job_id,)
    ).fetchone()
    return found


def status_is(conn: Any, job_id: int, *statuses: str) -> Callable[[], Any]:
    return lambda: row(conn, job_id)["status"] in statuses


def until_status(conn: Any, job_id: int, *statuses: str) -> dict[str, Any]:
    wait_for(status_is(conn, job_id, *statuses), what=f"job {job_id} to be {statuses}")
    return row(conn, job_id)


def later(conn: Any, seconds: float) -> datetime:
    """The database clock, `seconds` from now."""
    now: datetime = conn.execute("SELECT now() AS now").fetchone()["now"]
    return now + timedelta(seconds=seconds)
