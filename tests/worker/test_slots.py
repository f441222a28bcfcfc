"""The slots (`rota_worker.slots`) at shutdown: a job still running past the
grace period is given back, and logged readably."""

from __future__ import annotations

import logging
import threading

import rota
from rota.handlers import Handler
from rota.jobs import Job
from tests.worker.helpers import _running, row


def test_a_shutdown_past_its_grace_logs_each_job_readably(conn, db_url, caplog) -> None:
    # The job's row says running from its claim on; its handler starts later (a
    # loaded machine can take seconds): a worker stopped in between gives the job
    # back without ever starting it, and has no grace period to log.
    started, gate = threading.Event(), threading.Event()

    def stuck(job: Job) -> None:
        started.set()
        gate.wait(30)

    job_id = rota.enqueue(conn, "stuck")
    handlers = {"stuck": Handler("stuck", stuck, is_async=False, wants_context=False)}
    try:
        with (
            caplog.at_level(logging.WARNING, logger="rota.worker"),
            _running(db_url, handlers, concurrency=1, grace_period_seconds=0),
        ):
            assert started.wait(60), "the handler did not start"
    finally:
        gate.set()
    messages = [record.getMessage() for record in caplog.records]  # raised TypeError
    assert f"job {job_id} attempt 1 did not finish within the grace period; given back" in messages
    assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("ready", 0)
