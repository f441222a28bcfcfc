"""Steps: each one's function runs once per job and name; later runs answer from storage."""

from __future__ import annotations

import collections
from typing import Any

import pytest

import rota
from rota.jobs import Job
from rota.settings import BackoffSettings
from tests.durable.helpers import handlers, running, until_status

FAST = BackoffSettings(base_seconds=0.01, cap_seconds=0.01)
ran: collections.Counter[str] = collections.Counter()
"""Effects of this module's steps, by job and step (each test starts from none)."""


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    ran.clear()


def three_steps(job: Job, ctx: rota.Context) -> Any:
    def effect(name: str) -> str:
        ran[f"{job.id}:{name}"] += 1
        return name.upper()

    a = ctx.step("a", effect, "a")
    b = ctx.step("b", effect, name="b")
    if job.attempts == 1:
        raise RuntimeError("the first attempt fails after two steps")
    return [a, b, ctx.step("c", effect, "c")]


def twice(job: Job, ctx: rota.Context) -> None:
    ctx.step("same", lambda: 1)
    ctx.step("same", lambda: 2)


def writes_through_the_step(job: Job, ctx: rota.Context) -> Any:
    def insert() -> int:
        ctx.conn.execute("INSERT INTO effect (job_id) VALUES (%s)", (job.id,))
        return 1

    ctx.step("insert", insert)

    def fail_inside() -> None:
        ctx.conn.execute("INSERT INTO effect (job_id) VALUES (%s)", (-job.id,))
        raise RuntimeError("the step fails after its write")

    if job.attempts == 1:
        ctx.step("fails", fail_inside)
    return "ok"


async def async_steps(job: Job, ctx: rota.Context) -> Any:
    async def double(n: int) -> int:
        ran[f"{job.id}:double"] += 1
        return 2 * n

    first = await ctx.step("double", double, 21)
    if job.attempts == 1:
        raise RuntimeError("again")
    return first


HANDLERS = handlers(
    three_steps=three_steps,
    twice=twice,
    writes_through_the_step=writes_through_the_step,
    async_steps=async_steps,
)


def test_a_retried_job_answers_completed_steps_from_storage(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "three.steps", max_attempts=3)
    with running(db_url, HANDLERS, concurrency=1, backoff=FAST):
        row = until_status(conn, job_id, "done")
    assert row["result"] == ["A", "B", "C"]
    assert row["attempts"] == 2
    assert [ran[f"{job_id}:{n}"] for n in "abc"] == [1, 1, 1]
    steps = conn.execute(
        "SELECT name, attempt FROM rota.job_step WHERE job_id = %s ORDER BY name", (job_id,)
    ).fetchall()
    assert [(s["name"], s["attempt"]) for s in steps] == [("a", 1), ("b", 1), ("c", 2)]


def test_a_step_name_used_twice_in_one_run_fails_the_job(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "twice")
    with running(db_url, HANDLERS, concurrency=1):
        row = until_status(conn, job_id, "failed")
    assert "'same' used twice in one run" in row["last_error"]


def test_what_a_step_writes_through_its_connection_commits_with_it(conn, db_url) -> None:
    conn.execute("CREATE TABLE effect (job_id bigint)")
    job_id = rota.enqueue(conn, "writes.through.the.step")
    with running(db_url, HANDLERS, concurrency=1, backoff=FAST):
        until_status(conn, job_id, "done")
    written = [r["job_id"] for r in conn.execute("SELECT job_id FROM effect").fetchall()]
    assert written == [job_id]  # once, and the failed step's write rolled back


def test_async_handlers_await_their_steps(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "async.steps")
    with running(db_url, HANDLERS, concurrency=1, backoff=FAST):
        row = until_status(conn, job_id, "done")
    assert row["result"] == 42
    assert ran[f"{job_id}:double"] == 1
