"""The event loop's stall watch: an async handler blocking the loop costs no
neighbour its lease (renewed from another thread), and a stall is counted once."""

from __future__ import annotations

import threading
import time

import rota
from rota.handlers import Handler
from rota.jobs import Job
from rota_worker.stalls import StallWatch
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _running, row


def test_an_async_handler_blocking_the_loop_costs_no_neighbour_its_lease(conn, db_url) -> None:
    # time.sleep in an async def stops the event loop for longer than a lease. The
    # heartbeats come from their own thread: the sync job beside it keeps its lease,
    # and the stall is counted.
    gate = threading.Event()
    blocked = threading.Event()

    def steady(job: Job) -> None:
        gate.wait(60)

    async def blocker(job: Job) -> None:
        blocked.set()
        time.sleep(5)

    handlers = {
        **_async_handlers(blocker=blocker),
        "steady": Handler("steady", steady, is_async=False, wants_context=False),
    }
    expired = "SELECT locked_until < now() AS expired FROM rota.job WHERE id = %s"
    try:
        with _running(db_url, handlers, concurrency=2, lease_seconds=3) as worker:
            job_id = rota.enqueue(conn, "steady")
            wait_for(lambda: row(conn, job_id)["status"] == "running", 20, "the sync job to run")
            rota.enqueue(conn, "blocker")
            wait_for(blocked.is_set, 20, "the loop to be blocked")
            started = time.monotonic()
            while time.monotonic() - started < 5:  # the whole blocking sleep, and more
                assert not conn.execute(expired, (job_id,)).fetchone()["expired"]
                time.sleep(0.1)
            wait_for(lambda: worker.stalls.stalls >= 1, 20, "the stall to be counted")
            gate.set()
            wait_for(lambda: row(conn, job_id)["status"] == "done", 20, "the sync job's outcome")
    finally:
        gate.set()
    assert row(conn, job_id)["attempts"] == 1


def test_a_stall_of_the_event_loop_is_counted_once() -> None:
    watch = StallWatch(stall_seconds=1)
    now = watch.last_tick
    assert not watch.watch(now + 0.5)
    assert watch.watch(now + 1.5) and watch.watch(now + 2.5)
    assert watch.stalls == 1
    watch.last_tick = now + 3
    assert not watch.watch(now + 3.1)
    assert watch.watch(now + 4.5) and watch.stalls == 2
