"""Hostile values given to a durable job's calls, from sync handlers (in the
worker's threads and in its child processes) and from async ones.

The rule: a bad call fails its attempt with a one-line error, as any handler
exception does (the job retries or ends dead, `InvalidInput` where the API
refuses the value, failed for a misuse no retry mends), and it writes nothing
half-done: no step, wait, child or event of the refused call. The worker goes
on taking jobs, and no job is left running or waiting.

The sweep runs every case as a job of its own in one worker per mode; a child
process imports this module by name to find the cases and the handler.
"""

from __future__ import annotations

import asyncio
import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import rota
from rota.claim import claim
from rota.durable import Run
from rota.handlers import registered
from tests.acceptance.procs import wait_for
from tests.durable.helpers import handlers, row, running

Call = Callable[[rota.Context, rota.Job], Any]

HUGE = 10**400
"""A whole number no float holds."""


def _itself() -> list[Any]:
    looped: list[Any] = []
    looped.append(looped)
    return looped


def _writes_then_returns(ctx: rota.Context, job: rota.Job, value: Any) -> Callable[[], Any]:
    """A step's function that writes through `ctx.conn`, then returns `value`."""

    def fn() -> Any:
        ctx.conn.execute("INSERT INTO effect (job_id) VALUES (%s)", (job.id,))
        return value

    return fn


def _within_a_step(ctx: rota.Context, call: Callable[[], Any]) -> Any:
    return ctx.step("outer", call)


NAN = "Out of range float values are not JSON compliant"
STEP_VALUE = "Permanent: step 's' returned a value that"
NOT_JSON = "is not JSON-serialisable:"
SPAWN_TAKES = "Permanent: spawn takes delay, group, max_attempts, priority, run_at, timeout"
NO_KEY = "a child is unique by its parent and name, never by a key"
NUL = "must not contain a NUL character (PostgreSQL cannot store it)"
EMPTY = "must be a non-empty string, not"
IN_A_STEP = "inside a step: a step cannot wait"

# Each case: the call, then the first line of the job's error once its one
# attempt has ended ("" for a job that ends done), with {job} and {other}
# (a job that is not a child of this one) filled in.
CASES: dict[str, tuple[Call, str]] = {
    # -- step names
    "step ''": (lambda c, j: c.step("", int), f"InvalidInput: step name {EMPTY} ''"),
    "step blank": (lambda c, j: c.step(" \t", int), f"InvalidInput: step name {EMPTY} ' \\t'"),
    "step overlong": (
        lambda c, j: c.step("x" * 1025, int),
        "InvalidInput: step name is 1025 bytes long, over the limit of 1024",
    ),
    "step NUL": (lambda c, j: c.step("a\x00b", int), f"InvalidInput: step name {NUL}"),
    "step surrogate": (
        lambda c, j: c.step("\udcff", int),
        "InvalidInput: step name is not valid UTF-8: '\\udcff'",
    ),
    "step int": (lambda c, j: c.step(7, int), f"InvalidInput: step name {EMPTY} 7"),
    "step None": (lambda c, j: c.step(None, int), f"InvalidInput: step name {EMPTY} None"),
    "step bytes name": (lambda c, j: c.step(b"a", int), f"InvalidInput: step name {EMPTY} b'a'"),
    "step not callable": (
        lambda c, j: c.step("s", {"payment": "pay-1"}),
        "Permanent: step 's' takes a function to call, not a dict"
        " (pass the function and its arguments, not what it returned)",
    ),
    # -- what a step's function returns
    "step NaN": (
        lambda c, j: c.step("s", _writes_then_returns(c, j, math.nan)),
        f"{STEP_VALUE} {NOT_JSON} {NAN}",
    ),
    "step set": (
        lambda c, j: c.step("s", _writes_then_returns(c, j, {1, 2})),
        f"{STEP_VALUE} {NOT_JSON} Object of type set is not JSON serializable",
    ),
    "step bytes": (
        lambda c, j: c.step("s", _writes_then_returns(c, j, b"x")),
        f"{STEP_VALUE} {NOT_JSON} Object of type bytes is not JSON serializable",
    ),
    "step 300 kB": (
        lambda c, j: c.step("s", _writes_then_returns(c, j, "x" * 300_000)),
        f"{STEP_VALUE} is 300002 bytes, over the limit of 262144 bytes",
    ),
    "step itself": (
        lambda c, j: c.step("s", _writes_then_returns(c, j, _itself())),
        f"{STEP_VALUE} is nested more than 100 levels deep",
    ),
    "step wide": (
        lambda c, j: c.step("s", _writes_then_returns(c, j, [0] * 300_000)),
        f"{STEP_VALUE} is over the limit of 262144 bytes",
    ),
    # -- sleeps
    "sleep 0": (lambda c, j: c.sleep(0), ""),
    "sleep negative": (lambda c, j: c.sleep(-1), "InvalidInput: sleep must not be negative: -1"),
    "sleep NaN": (lambda c, j: c.sleep(math.nan), "InvalidInput: sleep must be a number, not nan"),
    "sleep inf": (lambda c, j: c.sleep(math.inf), "InvalidInput: sleep must be a number, not inf"),
    "sleep 10**400": (
        lambda c, j: c.sleep(HUGE),
        "InvalidInput: sleep must be at most 315360000 seconds (ten years), not 1000000000"
        "00000000000000000000000000000000000000000000000...",
    ),
    "sleep bool": (lambda c, j: c.sleep(True), "InvalidInput: sleep must be a number, not True"),
    "sleep str": (lambda c, j: c.sleep("5"), "InvalidInput: sleep must be a number, not '5'"),
    "sleep in a step": (
        lambda c, j: _within_a_step(c, lambda: c.sleep(0)),
        f"Permanent: 'sleep:1' {IN_A_STEP}",
    ),
    # -- waits for events
    "wait ''": (lambda c, j: c.wait_for(""), f"InvalidInput: event key {EMPTY} ''"),
    "wait blank": (lambda c, j: c.wait_for(" "), f"InvalidInput: event key {EMPTY} ' '"),
    "wait NUL": (lambda c, j: c.wait_for("k\x00"), f"InvalidInput: event key {NUL}"),
    "wait int": (lambda c, j: c.wait_for(5), f"InvalidInput: event key {EMPTY} 5"),
    "wait timeout 0": (
        lambda c, j: c.wait_for(f"never-{j.id}", timeout=0),
        "TimedOut: no event 'never-{job}' within 0s",
    ),
    "wait timeout negative": (
        lambda c, j: c.wait_for("k", timeout=-1),
        "InvalidInput: wait timeout must not be negative: -1",
    ),
    "wait timeout NaN": (
        lambda c, j: c.wait_for("k", timeout=math.nan),
        "InvalidInput: wait timeout must be a number, not nan",
    ),
    "wait timeout inf": (
        lambda c, j: c.wait_for("k", timeout=math.inf),
        "InvalidInput: wait timeout must be a number, not inf",
    ),
    "wait two-line key in a step": (
        lambda c, j: _within_a_step(c, lambda: c.wait_for("a\nb")),
        f"Permanent: 'event:a\\nb' {IN_A_STEP}",
    ),
    # -- children
    "spawn blank type": (lambda c, j: c.spawn(" "), f"InvalidInput: job type {EMPTY} ' '"),
    "spawn NaN payload": (
        lambda c, j: c.spawn("t", {"x": math.nan}),
        f"InvalidInput: payload {NOT_JSON} {NAN}",
    ),
    "spawn set payload": (
        lambda c, j: c.spawn("t", {1}),
        f"InvalidInput: payload {NOT_JSON} Object of type set is not JSON serializable",
    ),
    "spawn priority 10": (
        lambda c, j: c.spawn("t", priority=10),
        "InvalidInput: priority must be a whole number from 0 (first) to 9, not 10",
    ),
    "spawn max_attempts 0": (
        lambda c, j: c.spawn("t", max_attempts=0),
        "InvalidInput: max_attempts must be a whole number of at least 1, not 0",
    ),
    "spawn unknown option": (
        lambda c, j: c.spawn("t", colour="red"),
        f"{SPAWN_TAKES} (not colour): {NO_KEY}",
    ),
    "spawn two-line option": (
        lambda c, j: c.spawn("t", **{"a\nb": 1}),
        f"{SPAWN_TAKES} (not 'a\\nb'): {NO_KEY}",
    ),
    "spawn blank name": (
        lambda c, j: c.spawn("t", name=" "),
        f"InvalidInput: spawn name {EMPTY} ' '",
    ),
    "spawn name twice": (
        lambda c, j: [c.spawn("t", name="x"), c.spawn("u", name="x")],
        "Permanent: spawn name 'x' used twice in one run of job {job}",
    ),
    "spawn default name taken": (
        lambda c, j: [c.spawn("t", name="2"), c.spawn("u")],
        "Permanent: spawn name '2' used twice in one run of job {job}",
    ),
    # -- gathers
    "gather []": (lambda c, j: c.gather([]), ""),
    "gather 0": (
        lambda c, j: c.gather([0]),
        "InvalidInput: child id must be a whole number of at least 1, not 0",
    ),
    "gather 2**63": (
        lambda c, j: c.gather([2**63]),
        "InvalidInput: child id must be at most 9223372036854775807, not 9223372036854775808",
    ),
    "gather no such job": (
        lambda c, j: c.gather([2**63 - 1]),
        "Permanent: jobs [9223372036854775807] are not children of job {job}",
    ),
    "gather a stranger": (
        lambda c, j: c.gather([j.payload["other"]]),
        "Permanent: jobs [{other}] are not children of job {job}",
    ),
    "gather itself": (
        lambda c, j: c.gather([j.id]),
        "Permanent: jobs [{job}] are not children of job {job}",
    ),
    # -- events
    "emit NaN": (
        lambda c, j: rota.emit(c.dsn, "k", math.nan),
        f"InvalidInput: payload {NOT_JSON} {NAN}",
    ),
    "emit NaN inside": (
        lambda c, j: rota.emit(c.dsn, "k", {"x": [math.nan]}),
        f"InvalidInput: payload {NOT_JSON} {NAN}",
    ),
    "emit blank key": (
        lambda c, j: rota.emit(c.dsn, " ", {}),
        f"InvalidInput: event key {EMPTY} ' '",
    ),
}

EXPECTED_CHILDREN = {"spawn name twice": 1, "spawn default name taken": 1}
"""Children a refused call leaves (those made by the calls before it)."""


@rota.handler("hostile.calls")
def hostile_calls(job: rota.Job, ctx: rota.Context) -> Any:
    call, _ = CASES[job.payload["case"]]
    return call(ctx, job)


async def hostile_calls_async(job: rota.Job, ctx: rota.Context) -> Any:
    call, _ = CASES[job.payload["case"]]
    made = call(ctx, job)
    if isinstance(made, list):
        return [await m for m in made]
    return await made if asyncio.iscoroutine(made) else made


SYNC = {"hostile.calls": registered()["hostile.calls"]}
ASYNC = handlers(hostile_calls_async=hostile_calls_async)
MODES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "sync in a thread": (SYNC, {}),
    "async": (ASYNC, {}),
    "sync in a process": (
        SYNC,
        {"isolation": "process", "handler_modules": ["tests.durable.test_hostile_calls"]},
    ),
}


LEFT = """
SELECT (SELECT count(*) FROM rota.job_step WHERE job_id = %(job)s) AS steps,
       (SELECT count(*) FROM rota.job_wait WHERE job_id = %(job)s AND ended_at IS NULL) AS waits,
       (SELECT count(*) FROM rota.job WHERE parent_id = %(job)s) AS children,
       (SELECT count(*) FROM effect WHERE job_id = %(job)s) AS effects
"""
"""What a job's run left: steps, open waits, children, writes through `ctx.conn`."""


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_a_hostile_call_fails_its_attempt_in_one_line_and_writes_nothing(
    conn, db_url, mode
) -> None:
    served, settings = mode
    [job_type] = served
    conn.execute("CREATE TABLE effect (job_id bigint)")
    other = rota.enqueue(conn, "t", delay=3600)
    ids = {
        case: rota.enqueue(conn, job_type, {"case": case, "other": other}, max_attempts=1)
        for case in CASES
    }
    active = (
        "SELECT count(*) AS n FROM rota.job"
        " WHERE status IN ('ready', 'running', 'waiting') AND parent_id IS NULL"
    )
    with running(db_url, served, concurrency=2, **settings):
        wait_for(
            lambda: conn.execute(active + " AND type = %s", (job_type,)).fetchone()["n"] == 0,
            what="every case to end",
        )
        # The worker goes on: a job after them all runs as any.
        after = rota.enqueue(conn, job_type, {"case": "gather []"})
        wait_for(lambda: row(conn, after)["status"] == "done", what="a job after the cases")
    wrong = {}
    for case, job_id in ids.items():
        found = row(conn, job_id)
        expected = CASES[case][1].format(job=job_id, other=other)
        if not expected:
            want = ("done", "")
        elif expected.startswith(("InvalidInput", "TimedOut")):
            want = ("dead", expected)  # retried as any error, here up to max_attempts=1
        else:
            want = ("failed", expected)  # a misuse: no retry mends it
        got = (found["status"], (found["last_error"] or "").split("\n")[0])
        if got != want:
            wrong[case] = got
        # Nothing of the refused call: no step, no open wait, no child beyond
        # those made before it, nothing written inside the refused step.
        left = tuple(conn.execute(LEFT, {"job": job_id}).fetchone().values())
        if left != (0, 0, EXPECTED_CHILDREN.get(case, 0), 0):
            wrong[f"{case}: written"] = left
    assert wrong == {}
    assert conn.execute("SELECT count(*) AS n FROM rota.job_event").fetchone() == {"n": 0}
    assert conn.execute(active).fetchone() == {"n": 1}  # the job that is not a child


ENDING = ("ready", "running", "waiting")


def emits_then_waits(job: rota.Job, ctx: rota.Context) -> Any:
    woken = rota.emit(ctx.dsn, f"bare-{job.id}", *job.payload["payload"])
    return [woken, ctx.wait_for(f"bare-{job.id}")]


@pytest.mark.parametrize("payload", [[], [None]], ids=["no payload", "None"])
def test_an_event_emitted_with_no_payload_is_waited_for_as_none(conn, db_url, payload) -> None:
    # Python's rota.emit stored {} for a payload of None, so wait_for returned
    # {} where the SQL rota.emit(key) gives None.
    job_id = rota.enqueue(conn, "emits.then.waits", {"payload": payload})
    with running(db_url, handlers(emits_then_waits=emits_then_waits), concurrency=1):
        wait_for(lambda: row(conn, job_id)["status"] not in ENDING, what="the job to end")
    found = row(conn, job_id)
    assert (found["status"], found["result"]) == ("done", [0, None])
    conn.execute("SELECT rota.emit('from-sql')")
    events = conn.execute("SELECT key, payload FROM rota.job_event ORDER BY key").fetchall()
    assert [e["payload"] for e in events] == [None, None]


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT rota.emit('k', 'NaN')",
        """SELECT rota.emit('k', '{"x": NaN}')""",
        "SELECT rota.emit(' ', '{}')",
        "SELECT rota.emit(NULL, '{}')",
    ],
)
def test_sql_emit_refuses_nan_and_blank_keys_writing_nothing(conn, statement) -> None:
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(statement)
    assert "\n" not in raised.value.diag.message_primary
    assert conn.execute("SELECT count(*) AS n FROM rota.job_event").fetchone() == {"n": 0}


def test_a_step_returning_millions_of_values_is_refused_without_walking_them(conn, db_url) -> None:
    # The check of a result queued every item of a list before it counted any:
    # ten million of them took some 600 MiB more of the worker's memory before
    # the refusal.
    rota.enqueue(conn, "t")
    [job] = claim(conn, "w", 1, 30)
    run = Run(db_url, "w", job)
    many = [0] * 2_000_000
    tracemalloc.start()
    try:
        with pytest.raises(rota.Permanent) as raised:
            run.step("many", lambda: many)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        run.close()
    assert str(raised.value) == (
        "step 'many' returned a value that is over the limit of 262144 bytes"
    )
    assert peak < 8 * 2**20, f"{peak / 2**20:.0f} MiB"
    stored = conn.execute("SELECT count(*) AS n FROM rota.job_step").fetchone()
    assert stored == {"n": 0}
