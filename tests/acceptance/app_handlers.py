"""Handlers the acceptance tests run in real `rota worker` processes.

Each reads what it needs from the job and from ROTA_DATABASE_URL, like a user's
handler module would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psycopg

import rota

DSN = os.environ.get("ROTA_DATABASE_URL", "")


@rota.handler("effect")
def record_effect(job: rota.Job) -> None:
    """Write the job's effect and complete the job in one transaction of our own."""
    with psycopg.connect(DSN) as conn, conn.transaction():
        conn.execute(
            "INSERT INTO effects (key, job_id, attempt) VALUES (%s, %s, %s)",
            (job.effect_key, job.id, job.attempts),
        )
        if not rota.complete(conn, job):
            raise RuntimeError("lease lost: effect rolled back")


@rota.handler("noop")
async def noop(job: rota.Job) -> None:
    return None


@rota.handler("ten.steps")
def ten_steps(job: rota.Job, ctx: rota.Context) -> int:
    """A durable job: ten steps, each stored as it completes."""
    return sum(ctx.step(f"s{i}", int, i) for i in range(10))


@rota.handler("always.fails")
def always_fails(job: rota.Job) -> None:
    raise ValueError(f"cannot process {job.payload!r}")


@rota.handler("hang.first")
def hang_on_first_attempt(job: rota.Job) -> None:
    """The first attempt hangs (its worker will be killed); later ones succeed."""
    if job.attempts == 1:
        time.sleep(3600)


@rota.handler("gated")
def wait_for_gate(job: rota.Job) -> None:
    """Runs until the test opens the gate row for this job, then succeeds."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO started (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempts)
        )
        while not conn.execute("SELECT 1 FROM gate WHERE job_id = %s", (job.id,)).fetchone():
            time.sleep(0.05)


@rota.handler("slow")
def slow(job: rota.Job) -> None:
    time.sleep(float(job.payload.get("seconds", 0.05)))


def _ran(job: rota.Job, note: str = "started") -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (job_id, attempt, pid, note) VALUES (%s, %s, %s, %s)",
            (job.id, job.attempts, os.getpid(), note),
        )


@rota.handler("hang.async")
async def hang_async(job: rota.Job) -> None:
    """Never returns by itself; notes when it is cancelled."""
    _ran(job)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        _ran(job, "cancelled")
        raise


@rota.handler("hang.sync")
def hang_sync(job: rota.Job) -> None:
    """Ignores every stop signal: only killing its process ends it."""
    _ran(job)
    time.sleep(3600)


@rota.handler("hang.sync.noted")
def hang_sync_noted(job: rota.Job) -> None:
    """Ignores every stop signal but SIGTERM, whose arrival it notes before exiting
    (in a child process of `--isolation process`, where it runs in the main thread)."""

    def terminated(*_: object) -> None:
        _ran(job, "terminated")
        os._exit(1)

    signal.signal(signal.SIGTERM, terminated)
    _ran(job)
    time.sleep(3600)


@rota.handler("stubborn", timeout=1)
def stubborn(job: rota.Job) -> None:
    """Ignores job.cancelled until the test opens its gate (or a minute passes)."""
    _ran(job)
    with psycopg.connect(DSN, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if conn.execute("SELECT 1 FROM gate WHERE job_id = %s", (job.id,)).fetchone():
                return
            time.sleep(0.05)


@rota.handler("noop.other")
async def noop_other(job: rota.Job) -> None:
    return None


@rota.handler("noted")
def noted(job: rota.Job) -> None:
    """Notes when it starts (the order of starts shows priorities)."""
    _ran(job)
    time.sleep(0.01)


@rota.handler("asyncio.tools")
async def asyncio_tools(job: rota.Job) -> None:
    """A time limit of its own (asyncio.timeout) and a TaskGroup, each noted as it
    ends: both must work whether the worker starts its tasks eagerly or not."""
    try:
        async with asyncio.timeout(0.05):
            await asyncio.Event().wait()
    except TimeoutError:
        _ran(job, "own timeout")

    async def child(n: int) -> int:
        await asyncio.sleep(0.01 * n)
        return n

    async with asyncio.TaskGroup() as group:
        children = [group.create_task(child(n)) for n in range(3)]
    _ran(job, f"task group {sum(c.result() for c in children)}")


@rota.handler("limited.span")
def limited_span(job: rota.Job) -> None:
    """Record when the handler ran, by the database clock (table spans)."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO spans (job_id, group_key, started_at) VALUES (%s, %s, clock_timestamp())",
            (job.id, job.group_key),
        )
        time.sleep(float(job.payload.get("seconds", 0.02)))
        conn.execute("UPDATE spans SET ended_at = clock_timestamp() WHERE job_id = %s", (job.id,))
