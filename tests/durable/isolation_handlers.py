"""Handlers of the isolation tests (tests/durable/test_isolation.py and
test_cancel_running.py), run by a worker in the test process: in its threads
(thread isolation) or in its child processes, which import this module by
name (process isolation).

What a handler does is written to the test's table `effect` (job, what, the
process) on a connection of its own, committed at once: the test reads the
effects of every process. A step's effect written through `ctx.conn` goes to
`effect` too, and commits with the step or not at all. A handler that must
be held at a point waits there for a row of the test's table `gate`
(`release`), at most 30 s."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from typing import Any

import rota

HOLD_SECONDS = 30.0
"""The longest a handler is held at a point (a test that forgot to release it)."""


def record(ctx: rota.Context, job: rota.Job, what: str) -> str:
    """Write `what` happened, now, whatever becomes of the attempt."""
    with ctx.connect() as conn:
        conn.execute(
            "INSERT INTO effect (job_id, what, pid) VALUES (%s, %s, %s)",
            (job.id, what, os.getpid()),
        )
    return what


def held(ctx: rota.Context, job: rota.Job, point: str) -> None:
    """Say that `point` is reached, then wait there, ignoring any stop, until the
    test releases it (a row of `gate`)."""
    record(ctx, job, point)
    deadline = time.monotonic() + HOLD_SECONDS
    with ctx.connect() as conn:
        while time.monotonic() < deadline:
            found = conn.execute(
                "SELECT 1 FROM gate WHERE job_id = %s AND point = %s", (job.id, point)
            ).fetchone()
            if found:
                return
            time.sleep(0.02)


@rota.handler("iso.journey")
def journey(job: rota.Job, ctx: rota.Context) -> Any:
    """A step, a sleep, a wait for an event and a step."""
    first = ctx.step("first", record, ctx, job, "first")
    ctx.sleep(3600)
    event = ctx.wait_for(job.payload["key"])
    last = ctx.step("last", record, ctx, job, "last")
    return [first, event, last]


@rota.handler("iso.naps.briefly")
def naps_briefly(job: rota.Job, ctx: rota.Context) -> Any:
    ctx.sleep(0.5)
    return "rested"


@rota.handler("iso.fans.out")
def fans_out(job: rota.Job, ctx: rota.Context) -> Any:
    ids = [ctx.spawn("iso.child", {"n": n}) for n in range(job.payload["children"])]
    results = ctx.gather(ids)
    ctx.step("sum", record, ctx, job, "sum")
    return {"results": results, "pid": os.getpid()}


@rota.handler("iso.child")
def child(job: rota.Job, ctx: rota.Context) -> Any:
    ctx.step("double", record, ctx, job, "double")
    return {"double": 2 * job.payload["n"], "pid": os.getpid()}


def _writes_then_holds(ctx: rota.Context, job: rota.Job) -> str:
    ctx.conn.execute(
        "INSERT INTO effect (job_id, what, pid) VALUES (%s, 'written', %s)",
        (job.id, os.getpid()),
    )
    if job.attempts == 1:
        held(ctx, job, "inside")
    return "stored"


@rota.handler("iso.holds.in.a.step")
def holds_in_a_step(job: rota.Job, ctx: rota.Context) -> Any:
    """Its first attempt writes through the step's connection, then is held
    inside the step (ignoring its stop)."""
    return ctx.step("write", _writes_then_holds, ctx, job)


@rota.handler("iso.not.json")
def not_json(job: rota.Job, ctx: rota.Context) -> Any:
    return ctx.step("when", lambda: {"at": datetime.now(UTC)})


def _until_cancel_is(ctx: rota.Context, job: rota.Job, known: str) -> str:
    """Return once the job's cancel request is in the database ("stored"), or
    once the worker has stopped the attempt for it ("heard")."""
    record(ctx, job, "step")
    if known == "heard":
        job.cancelled.wait(HOLD_SECONDS)
        return known
    deadline = time.monotonic() + HOLD_SECONDS
    with ctx.connect() as conn:
        while time.monotonic() < deadline:
            found = conn.execute(
                "SELECT cancel_requested_at FROM rota.job WHERE id = %s", (job.id,)
            ).fetchone()
            if found["cancel_requested_at"] is not None:
                break
            time.sleep(0.02)
    return known


@rota.handler("iso.cancelled.in.a.step")
def cancelled_in_a_step(job: rota.Job, ctx: rota.Context) -> Any:
    """A step that ends once its job's cancel request is known, then a sleep or a
    wait (the payload says which)."""
    ctx.step("until cancelled", _until_cancel_is, ctx, job, job.payload["known"])
    if job.payload["then"] == "sleep":
        ctx.sleep(3600)
    elif job.payload["then"] == "spawn":
        ctx.spawn("iso.never.run", {})
    else:
        ctx.wait_for(f"never:{job.id}")
    return record(ctx, job, "after")


@rota.handler("iso.async.cancelled.in.a.step")
async def async_cancelled_in_a_step(job: rota.Job, ctx: rota.Context) -> Any:
    """`cancelled_in_a_step` for async handlers (the cancel request as stored only:
    a heard one cancels the handler's task)."""

    async def until_cancelled() -> str:
        return await asyncio.to_thread(_until_cancel_is, ctx, job, "stored")

    await ctx.step("until cancelled", until_cancelled)
    if job.payload["then"] == "sleep":
        await ctx.sleep(3600)
    elif job.payload["then"] == "spawn":
        await ctx.spawn("iso.never.run", {})
    else:
        await ctx.wait_for(f"never:{job.id}")
    return record(ctx, job, "after")


@rota.handler("iso.swallows.suspension")
def swallows_suspension(job: rota.Job, ctx: rota.Context) -> Any:
    """Its `except Exception` meant for `rota.TimedOut` catches `rota.Suspended`:
    the timeout branch's step must not run."""
    try:
        return ctx.wait_for(f"shipped:{job.id}", timeout=3600)
    except Exception:
        try:
            ctx.step("refund", record, ctx, job, "refund")
        except Exception as again:
            record(ctx, job, f"then {type(again).__name__}")
        return "cancelled"
