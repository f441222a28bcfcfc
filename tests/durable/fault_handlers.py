"""Handlers of the fault test (tests/durable/test_faults.py), run by `rota worker`
subprocesses: a job of N steps that kills its own process at the points its
payload names, each point once (the first time it is reached)."""

from __future__ import annotations

import os
import signal
from typing import Any

import rota


@rota.handler("fault.steps")
def fault_steps(job: rota.Job, ctx: rota.Context) -> Any:
    for i in range(job.payload["steps"]):
        ctx.step(f"step-{i}", _effect, job, ctx, i)
        _maybe_die(job, ctx, f"after-{i}")
    return "finished"


def _effect(job: rota.Job, ctx: rota.Context, i: int) -> int:
    # The effect is written through the run's connection: it commits with the
    # step's result, or not at all (a kill inside the step rolls it back).
    ctx.conn.execute("INSERT INTO fault_effect (job_id, step) VALUES (%s, %s)", (job.id, i))
    _maybe_die(job, ctx, f"inside-{i}")
    return i


def _maybe_die(job: rota.Job, ctx: rota.Context, point: str) -> None:
    if point not in job.payload["kills"]:
        return
    with ctx.connect() as conn:
        first = conn.execute(
            "INSERT INTO fault_kill (job_id, point) VALUES (%s, %s)"
            " ON CONFLICT DO NOTHING RETURNING point",
            (job.id, point),
        ).fetchone()
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
