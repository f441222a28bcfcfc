"""The slots (`rota_worker.slots`) at shutdown: a job still running past the
grace period is given back, and logged readably."""

from __future__ import annotations

import logging
import threading
import time

import rota
from rota.handlers import Handler
from rota.jobs import Job
from rota_worker.settings import WorkerSettings
from rota_worker.slots import STOP_MARGIN_SECONDS
from rota_worker.worker import Worker
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


def test_a_stop_ends_within_its_grace_period_and_the_margin(conn, db_url) -> None:
    # A handler that ignores its stop: the grace period runs from the stop, and
    # everything after it (the wait for stopped handlers, the give-back, the
    # loops stopped) fits in STOP_MARGIN_SECONDS.
    started, gate = threading.Event(), threading.Event()

    def ignores_its_stop(job: Job) -> None:
        started.set()
        gate.wait(60)

    job_id = rota.enqueue(conn, "stuck")
    handlers = {"stuck": Handler("stuck", ignores_its_stop, is_async=False, wants_context=False)}
    settings = WorkerSettings(
        concurrency=1, run_reaper=False, run_scheduler=False, grace_period_seconds=1
    )
    worker = Worker(db_url, settings, handlers=handlers)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert started.wait(60), "the handler did not start"
        asked = time.monotonic()
        worker.stop()
        thread.join(timeout=60)
        took = time.monotonic() - asked
    finally:
        gate.set()
    assert not thread.is_alive()
    assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("ready", 0)
    # A loaded machine may add half a second of scheduling to the bound.
    assert took < 1 + STOP_MARGIN_SECONDS + 0.5, took
