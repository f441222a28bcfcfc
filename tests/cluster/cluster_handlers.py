"""Handlers for the real-cluster run, added to the worker image the way users add
theirs: an image built FROM the worker image with this module in /app."""

from __future__ import annotations

import logging
import time

import rota

log = logging.getLogger(__name__)


@rota.handler("cluster.work")
def work(job: rota.Job) -> None:
    """Take `seconds` of wall time, so a worker can be killed while jobs run."""
    seconds = float(job.payload.get("seconds", 0))
    log.info("work %s: %.1fs", job.id, seconds)
    time.sleep(seconds)


@rota.handler("cluster.tick")
def tick(job: rota.Job) -> None:
    """Succeed at once: scheduled jobs only have to get done."""
    log.info("tick %s: %s", job.id, job.payload)
