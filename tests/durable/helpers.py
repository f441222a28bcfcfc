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


ISOLATION_HANDLERS = "tests.durable.isolation_handlers"
"""The module of handlers a worker imports in its child processes (process isolation)."""


def isolated(conn: Any) -> dict[str, Handler]:
    """The handlers of tests/durable/isolation_handlers.py, by type, with the tables
    they write to made in the test's database."""
    import tests.durable.isolation_handlers  # noqa: F401  (registers them)
    from rota.handlers import registered

    conn.execute(
        "CREATE TABLE IF NOT EXISTS effect (n bigserial, job_id bigint, what text, pid int)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS gate (job_id bigint, point text)")
    return {t: h for t, h in registered().items() if t.startswith("iso.")}


def effects(conn: Any, job_id: int) -> list[tuple[str, int]]:
    """What a job's handlers did (isolation_handlers.record), in order, with the process."""
    rows = conn.execute(
        "SELECT what, pid FROM effect WHERE job_id = %s ORDER BY n", (job_id,)
    ).fetchall()
    return [(r["what"], r["pid"]) for r in rows]


def did(conn: Any, job_id: int, what: str) -> bool:
    return any(done == what for done, _ in effects(conn, job_id))
