"""Steps: each one's function runs once per job and name; later runs answer from storage."""

from __future__ import annotations

import collections
import decimal
from typing import Any

import pytest

import rota
from rota import control
from rota.jobs import Job
from rota.settings import BackoffSettings
from tests.acceptance.procs import wait_for
from tests.durable.helpers import handlers, row, running, until_status

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


def returns_a_decimal(job: Job, ctx: rota.Context) -> Any:
    return ctx.step("dt", lambda: {"d": decimal.Decimal("1.5")})


def test_a_step_whose_result_is_not_json_fails_the_job_naming_the_step(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "returns.a.decimal", max_attempts=3)
    with running(db_url, handlers(returns_a_decimal=returns_a_decimal), concurrency=1):
        found = wait_for(lambda: ended_once(conn, job_id), what="the first attempt to end")
    assert (found["status"], found["attempts"]) == ("failed", 1)
    assert found["last_error"].startswith(
        "Permanent: step 'dt' returned a value that is not JSON-serialisable:"
    ), found["last_error"]
    stored = conn.execute("SELECT 1 FROM rota.job_step WHERE job_id = %s", (job_id,))
    assert stored.fetchall() == []


def steps_after_its_stop(job: Job, ctx: rota.Context) -> Any:
    ctx.step("before", lambda: ran.update([f"{job.id}:before"]))
    assert job.cancelled.wait(30), "the attempt was not stopped"
    return ctx.step("after", lambda: ran.update([f"{job.id}:after"]))


def test_a_stopped_attempt_starts_no_new_step(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "steps.after.its.stop", timeout=0.5, max_attempts=1)
    with running(db_url, handlers(steps_after_its_stop=steps_after_its_stop), concurrency=1):
        found = until_status(conn, job_id, "dead", "failed", "done")
    assert found["last_error"].startswith("Timeout: the attempt ran longer"), found["last_error"]
    assert (ran[f"{job_id}:before"], ran[f"{job_id}:after"]) == (1, 0)
    stored = conn.execute("SELECT name FROM rota.job_step WHERE job_id = %s", (job_id,))
    assert [r["name"] for r in stored] == ["before"]


def ended_once(conn: Any, job_id: int) -> dict[str, Any] | None:
    """The job's row once its first attempt has ended (written), else None."""
    found = row(conn, job_id)
    return found if found["attempts"] and found["status"] != "running" else None


def dies_after_a_step(job: Job, ctx: rota.Context) -> Any:
    def effect(name: str) -> str:
        ran[f"{job.id}:{name}"] += 1
        return name

    first = ctx.step("first", effect, "first")
    if job.last_error is None:
        raise RuntimeError("its first life ends after one step")
    return [first, ctx.step("second", effect, "second")]


def test_a_dead_job_retried_keeps_its_steps(conn, db_url) -> None:
    # `rota dead retry` brings the same job back: its stored steps answer again.
    job_id = rota.enqueue(conn, "dies.after.a.step", max_attempts=1)
    with running(db_url, handlers(dies_after_a_step=dies_after_a_step), concurrency=1):
        until_status(conn, job_id, "dead")
        assert control.retry_dead(conn, [job_id]) == [job_id]
        done = until_status(conn, job_id, "done", "dead")
    assert (done["result"], done["attempts"]) == (["first", "second"], 1)
    assert (ran[f"{job_id}:first"], ran[f"{job_id}:second"]) == (1, 1)


seen: dict[int, list[Any]] = collections.defaultdict(list)
"""What each run of a job saw of its step's result, as repr, in order."""


def reads_its_step(job: Job, ctx: rota.Context) -> Any:
    value = ctx.step("lines", lambda: {"sprocket-xl": 3, "nut": 100, "big": 1e20, "neg": -0.0})
    seen[job.id].append([(key, repr(item)) for key, item in value.items()])
    if job.attempts == 1:
        raise RuntimeError("again: the next run reads the step from storage")
    return "read"


def test_a_step_returns_on_its_first_run_what_later_runs_read(conn, db_url) -> None:
    # The first run returned the value as JSON gives it back (keys in their
    # order, 1e20 a float, -0.0), later ones as jsonb stores it (keys shortest
    # first, 1e20 an int, 0.0): a loop over the keys paired them with other
    # children on a later run.
    job_id = rota.enqueue(conn, "reads.its.step", max_attempts=2)
    with running(db_url, handlers(reads_its_step=reads_its_step), concurrency=1, backoff=FAST):
        until_status(conn, job_id, "done")
    first, later = seen[job_id]
    assert first == later


def calls_its_step_too_soon(job: Job, ctx: rota.Context) -> Any:
    ran[f"{job.id}:before"] += 1
    return ctx.step("charge", ran.update([f"{job.id}:charge"]))  # the call's result


def test_a_step_given_no_function_fails_at_once(conn, db_url) -> None:
    # A TypeError retried as any error: the code before the step (here the
    # charge itself, called too soon) ran again on every attempt.
    job_id = rota.enqueue(conn, "calls.its.step.too.soon", max_attempts=3)
    too_soon = handlers(calls_its_step_too_soon=calls_its_step_too_soon)
    with running(db_url, too_soon, concurrency=1, backoff=FAST):
        found = wait_for(lambda: ended_once(conn, job_id), what="the first attempt to end")
    assert (found["status"], found["attempts"]) == ("failed", 1), found["last_error"]
    assert found["last_error"].startswith(
        "Permanent: step 'charge' takes a function to call, not a NoneType"
    ), found["last_error"]
    assert (ran[f"{job_id}:before"], ran[f"{job_id}:charge"]) == (1, 1)
