"""What the durable-job tests share: a worker in this process and waits on rows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from rota.handlers import Handler
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _running as running  # a worker in this process

__all__ = ["handlers", "later", "row", "running", "status_is", "until_status"]


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
