"""Handlers for the benchmark's Rota workers (`rota worker --handlers bench.handlers`).

Both are async, as are the peers' handlers, so that the queue, not a thread
pool, is what is measured.
"""

from __future__ import annotations

import rota
from bench.measure import record_start


@rota.handler("bench.noop")
async def noop(job: rota.Job) -> None:
    """Does nothing: a drain of these measures the queue's own cost per job."""


@rota.handler("bench.latency")
async def latency(job: rota.Job) -> None:
    """Notes when it started beside the enqueue time carried in its payload."""
    record_start(job.payload["path"], job.payload["t"])
