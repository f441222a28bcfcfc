"""The slots (`rota_worker.slots`) at shutdown: a job still running past the
grace period is given back, and logged readably."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import rota
from rota.handlers import Handler
from rota.jobs import Job
from rota_worker.settings import WorkerSettings
from rota_worker.slots import STOP_MARGIN_SECONDS
from rota_worker.worker import LEFT_BEHIND_SECONDS, Worker
from tests.acceptance.procs import wait_for
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


def stop_past_a_stubborn_handler(
    db_url: str, handler: Handler, started: threading.Event, gate: threading.Event
) -> tuple[bool, float]:
    """Run a worker (grace period 1 s) until `handler` has started, stop it, and
    wait for its end (at most 30 s); whether it ended, and how long the stop
    took. `gate` lets the handler go afterwards, whatever happened."""
    settings = WorkerSettings(
        concurrency=1, run_reaper=False, run_scheduler=False, grace_period_seconds=1
    )
    worker = Worker(db_url, settings, handlers={handler.type: handler})
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert started.wait(60), "the handler did not start"
        asked = time.monotonic()
        worker.stop()
        thread.join(timeout=30)
        took = time.monotonic() - asked
        ended = not thread.is_alive()
    finally:
        gate.set()
        thread.join(timeout=30)
    return ended, took


def test_a_stop_ends_within_its_grace_period_and_the_margin(conn, db_url) -> None:
    # A handler that ignores its stop: the grace period runs from the stop, and
    # everything after it (the wait for stopped handlers, the give-back, the
    # loops stopped) fits in STOP_MARGIN_SECONDS.
    started, gate = threading.Event(), threading.Event()

    def ignores_its_stop(job: Job) -> None:
        started.set()
        gate.wait(60)

    job_id = rota.enqueue(conn, "stuck")
    handler = Handler("stuck", ignores_its_stop, is_async=False, wants_context=False)
    ended, took = stop_past_a_stubborn_handler(db_url, handler, started, gate)
    assert ended
    assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("ready", 0)
    # A loaded machine may add half a second of scheduling to the bound.
    assert took < 1 + STOP_MARGIN_SECONDS + 0.5, took


def test_an_async_handler_that_swallows_its_stop_does_not_hold_the_worker(conn, db_url) -> None:
    # It catches every cancellation and goes on: the worker gives its job back
    # (written, not only logged) and ends within the bound all the same, leaving
    # the task behind, as it leaves a sync handler's thread.
    started, gate = threading.Event(), threading.Event()

    async def swallows(job: Job) -> None:
        started.set()
        while not gate.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    job_id = rota.enqueue(conn, "stubborn")
    handler = Handler("stubborn", swallows, is_async=True, wants_context=False)
    ended, took = stop_past_a_stubborn_handler(db_url, handler, started, gate)
    assert ended, "the worker waited on a handler that ignores its cancellation"
    assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("ready", 0)
    # The loop's end gives the cancelled task LEFT_BEHIND_SECONDS more.
    assert took < 1 + STOP_MARGIN_SECONDS + LEFT_BEHIND_SECONDS + 1.5, took


def test_an_async_handler_that_returns_after_its_timeout_ends_as_the_timeout_says(
    conn, db_url
) -> None:
    # As a sync handler's return after its stop: the stop decides, never done.
    async def swallows_its_timeout(job: Job) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    job_id = rota.enqueue(conn, "late", timeout=0.3, max_attempts=1)
    handlers = {"late": Handler("late", swallows_its_timeout, is_async=True, wants_context=False)}
    with _running(db_url, handlers, concurrency=1):
        wait_for(lambda: row(conn, job_id)["status"] not in ("ready", "running"), what="an end")
    ended = row(conn, job_id)
    assert (ended["status"], ended["result"]) == ("dead", None), ended
    assert ended["last_error"].startswith("Timeout: the attempt ran longer"), ended["last_error"]


def test_a_job_stopped_by_its_timeout_is_not_logged_as_given_back_at_shutdown(
    conn, db_url, caplog
) -> None:
    # Its timeout stopped it first: it ends as the timeout says (a retry), so
    # the shutdown's "given back" would be a false line.
    stopped, gate = threading.Event(), threading.Event()

    def overruns(job: Job) -> None:
        job.cancelled.wait(30)
        stopped.set()
        gate.wait(30)

    job_id = rota.enqueue(conn, "overruns", timeout=0.2)
    handlers = {"overruns": Handler("overruns", overruns, is_async=False, wants_context=False)}
    try:
        with (
            caplog.at_level(logging.WARNING, logger="rota.worker"),
            _running(db_url, handlers, concurrency=1, grace_period_seconds=0),
        ):
            assert stopped.wait(60), "the timeout did not stop the handler"
    finally:
        gate.set()
    messages = [record.getMessage() for record in caplog.records]
    assert not any("did not finish within the grace period" in m for m in messages), messages
    ended = row(conn, job_id)
    assert ended["last_error"].startswith("Timeout"), ended
