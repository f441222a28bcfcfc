"""Sync handlers in threads (rota_worker.threads): a handler that returns when
told to stop is no overrun, and one that ignores its stop is."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from rota.handlers import Context, Handler
from rota.jobs import Job, Status
from rota_worker.threads import ThreadRunner

OVERRUN = "the handler's thread runs on past its stop"


def running_job() -> Job:
    now = datetime.now(UTC)
    return Job(1, "t", {}, None, Status.RUNNING, now, attempts=1, max_attempts=3)


def stopped_run(
    func: Any, look_after: float, before_return: Any = None
) -> tuple[int, list[dict[str, Any]]]:
    """Run `func` as a sync handler, stop it as `Execution.signal_stop` does, and
    wait for the attempt to end: the overruns counted `look_after` seconds after
    the stop, and what the event loop reported as an error meanwhile."""
    handler = Handler("t", func, is_async=False, wants_context=False)
    reported: list[dict[str, Any]] = []

    async def main() -> int:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        runner = ThreadRunner(1)
        job = running_job()
        task = asyncio.create_task(runner(handler, job, Context("", "w"), lambda: None))
        await asyncio.sleep(0.1)
        job.cancelled.set()
        task.cancel()
        await asyncio.sleep(look_after)
        overruns = runner.abandoned
        if before_return is not None:
            before_return()
        with pytest.raises(asyncio.CancelledError):
            await task
        runner.close()
        del task
        gc.collect()  # an exception nobody read is reported when its future goes
        await asyncio.sleep(0)
        return overruns

    return asyncio.run(main()), reported


def test_a_handler_that_stops_when_told_is_no_overrun(caplog: pytest.LogCaptureFixture) -> None:
    def handler(job: Job) -> None:  # as docs/job-control.md tells a sync handler to
        job.cancelled.wait(30)
        job.raise_if_cancelled()

    with caplog.at_level(logging.WARNING, logger="rota.worker"):
        overruns, reported = stopped_run(handler, look_after=0.2)
    assert overruns == 0
    assert OVERRUN not in caplog.text
    assert reported == []  # no "Future exception was never retrieved"


def test_a_handler_that_ignores_its_stop_overruns(caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()

    def handler(job: Job) -> None:
        gate.wait(30)
        raise ValueError("too late")

    with caplog.at_level(logging.WARNING, logger="rota.worker"):
        overruns, reported = stopped_run(handler, look_after=2.0, before_return=gate.set)
    assert overruns == 1
    assert OVERRUN in caplog.text
    assert reported == []
