"""Handlers for the kind end-to-end run, added to the worker image the way users
add theirs: an image built FROM the worker image with this module in /app."""

from __future__ import annotations

import logging

import rota

log = logging.getLogger(__name__)


@rota.handler("e2e.tick")
def tick(job: rota.Job) -> None:
    """Succeed at once: the run only checks that scheduled jobs get done."""
    log.info("tick %s: %s", job.id, job.payload)
