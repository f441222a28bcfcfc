"""The claim loop in a worker of this process, against a real database: claims
refused or whose answer was lost, outcomes the database refuses, handlers that
fail awkwardly, and an idle worker's wait for a NOTIFY."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest

import rota
from rota import claim as claims
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.jobs import Job
from rota_worker.claiming import wait_after
from rota_worker.link import Backoff, Link
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _noop, _running, row


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def test_awkward_handler_errors_end_their_jobs_and_the_worker_goes_on(conn, db_url) -> None:
    # PostgreSQL stores no NUL in text and no infinite interval: written as they
    # were, these outcomes failed and took the worker's claim loop down with them.
    # An exception whose message cannot be read left its job running for ever.
    async def nul(job: Job) -> None:
        raise ValueError("bad\x00byte")

    async def forever(job: Job) -> None:
        raise rota.Retry(delay=math.inf)

    async def unprintable(job: Job) -> None:
        raise Unprintable()

    handlers = _async_handlers(nul=nul, forever=forever, unprintable=unprintable, noop=_noop)
    bad = rota.enqueue(conn, "nul", max_attempts=1)
    never = rota.enqueue(conn, "forever", max_attempts=1)
    mute = rota.enqueue(conn, "unprintable", max_attempts=1)
    with _running(db_url, handlers, concurrency=2):
        dead = "SELECT count(*) AS n FROM rota.job WHERE status = 'dead'"
        wait_for(lambda: conn.execute(dead).fetchone()["n"] == 3, what="the three to be dead")
        assert row(conn, bad)["last_error"].startswith("ValueError: bad\\x00byte")
        assert row(conn, never)["last_error"].startswith("ValueError: Retry delay must be")
        assert row(conn, mute)["last_error"].startswith("Unprintable: <its message could not")
        good = rota.enqueue(conn, "noop")
        wait_for(lambda: row(conn, good)["status"] == "done", what="the next job to be done")


def test_a_claim_whose_outcomes_are_refused_goes_on_without_them(conn, db_url, monkeypatch) -> None:
    # An outcome the database cannot take, as a NUL in an error was before
    # describe_error showed it as \x00: the claim carrying it fails, the buffer
    # writes the batch one at a time, and the worker goes on.
    import rota_worker.execute

    monkeypatch.setattr(rota_worker.execute, "describe_error", lambda exc: f"raw: {exc}")

    async def nul(job: Job) -> None:
        raise ValueError("bad\x00byte")

    rota.enqueue_many(conn, [rota.NewJob("nul"), *[rota.NewJob("noop") for _ in range(20)]])
    done = "SELECT count(*) AS n FROM rota.job WHERE type = 'noop' AND status = 'done'"
    with _running(db_url, _async_handlers(nul=nul, noop=_noop), concurrency=4) as worker:
        wait_for(lambda: conn.execute(done).fetchone()["n"] == 20, what="the others to be done")
        wait_for(lambda: worker.outcomes.unsettled == 0, what="every outcome to be settled")
        bad = conn.execute("SELECT status, last_error FROM rota.job WHERE type = 'nul'").fetchone()
        assert bad == {"status": "running", "last_error": None}  # left to its lease


def test_a_refused_claim_waits_and_tries_again_while_running_attempts_finish(
    conn, db_url, monkeypatch
) -> None:
    # The database refuses claims for a while (not an outage: a grant taken back,
    # say). The worker stays up and not ready, the attempt already running ends
    # and its outcome is written meanwhile, and claims resume once allowed.
    refusing = threading.Event()
    refusals = {"n": 0}

    def refused_while(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if refusing.is_set():
                refusals["n"] += 1
                raise DatabaseError("InsufficientPrivilege: permission denied for table job")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(claims, "claim", refused_while(claims.claim))
    monkeypatch.setattr(claims, "write_and_claim", refused_while(claims.write_and_claim))
    gate = threading.Event()

    async def gated(job: Job) -> None:
        while not gate.is_set():
            await asyncio.sleep(0.01)

    first_job = rota.enqueue(conn, "gated")
    with _running(
        db_url, _async_handlers(gated=gated, noop=_noop), concurrency=2, reconnect_max_seconds=0.2
    ) as worker:
        wait_for(lambda: row(conn, first_job)["status"] == "running", 20, "the first job to run")
        refusing.set()
        later = rota.enqueue(conn, "noop")
        wait_for(lambda: refusals["n"] >= 2 and not worker.claims.ready, 20, "claims refused")
        gate.set()
        wait_for(lambda: row(conn, first_job)["status"] == "done", 20, "the running job's outcome")
        assert row(conn, later)["status"] == "ready"  # nothing claimed while refused
        refusing.clear()
        wait_for(lambda: row(conn, later)["status"] == "done", 20, "claims to resume")
        assert worker.claims.ready
    assert [row(conn, i)["attempts"] for i in (first_job, later)] == [1, 1]


def test_the_jobs_of_a_claim_whose_answer_was_lost_are_given_back(
    conn, db_url, monkeypatch
) -> None:
    # The database committed the claim, then the connection broke before its
    # answer arrived: the jobs run under this worker's name and nobody holds them.
    # They are given back, attempt not counted, without waiting for their lease;
    # the first look for them is refused (not an outage), and tried again.
    real = claims.write_and_claim
    real_running_of = claims.running_of
    lost: list[int] = []
    looks: list[str] = []

    def refused_once(*args: Any, **kwargs: Any) -> Any:
        if not looks:
            looks.append("refused")
            raise DatabaseError("InsufficientPrivilege: permission denied for table job")
        looks.append("answered")
        return real_running_of(*args, **kwargs)

    def answer_lost(*args: Any, **kwargs: Any) -> Any:
        written, jobs = real(*args, **kwargs)
        if jobs and not lost:
            lost.extend(job.id for job in jobs)
            raise DatabaseUnavailable("database unavailable: the answer was lost")
        return written, jobs

    monkeypatch.setattr(claims, "write_and_claim", answer_lost)
    monkeypatch.setattr(claims, "running_of", refused_once)
    ids = rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(6)])
    with _running(db_url, _async_handlers(noop=_noop), concurrency=2):
        every = "SELECT count(*) AS n FROM rota.job WHERE status = 'done'"
        wait_for(lambda: conn.execute(every).fetchone()["n"] == 6, timeout=20, what="all done")
    assert lost
    assert looks[:2] == ["refused", "answered"]
    done = [row(conn, i) for i in ids]
    assert [(r["attempts"], r["releases"]) for r in done] == [(1, 0)] * 6  # a release resets


@pytest.mark.parametrize("database", ["back", "still away"])
def test_a_worker_stopping_after_a_lost_claim_gives_its_jobs_back(
    conn, db_url, monkeypatch, caplog, database
) -> None:
    # The answer of a committed claim is lost and the worker is asked to stop at
    # that moment: before it exits, it gives the claim's jobs back (ready, attempt
    # not counted) instead of leaving them running under its name until their
    # lease expires and the reaper counts the attempt. If the database is still
    # away, it says so and exits all the same: the lease is all there is.
    real = claims.write_and_claim
    lost: list[int] = []
    worker = Worker(
        db_url,
        WorkerSettings(concurrency=2, run_reaper=False, run_scheduler=False, lease_seconds=600),
        handlers=_async_handlers(noop=_noop),
    )

    def answer_lost(*args: Any, **kwargs: Any) -> Any:
        written, jobs = real(*args, **kwargs)
        if jobs and not lost:
            lost.extend(job.id for job in jobs)
            worker.stop()
            raise DatabaseUnavailable("database unavailable: the answer was lost")
        return written, jobs

    def away(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseUnavailable("database unavailable: still away")

    monkeypatch.setattr(claims, "write_and_claim", answer_lost)
    if database == "still away":
        monkeypatch.setattr(claims, "running_of", away)
    ids = rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(6)])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert lost
    rows = {i: row(conn, i) for i in ids}
    left = [(rows[i]["status"], rows[i]["attempts"], rows[i]["releases"]) for i in lost]
    if database == "back":
        assert left == [("ready", 0, 1)] * len(lost)
    else:
        assert left == [("running", 1, 0)] * len(lost)
        assert "could not be given back (database unavailable: still away)" in caplog.text
    others = [r for i, r in rows.items() if i not in lost]
    assert all(r["status"] == "ready" and r["attempts"] == 0 for r in others)


def test_an_idle_worker_claims_on_a_notify_and_stops_without_waiting_for_its_poll(
    conn, db_url, monkeypatch
) -> None:
    # An idle worker's next claim waits for a NOTIFY in its I/O thread: a job
    # enqueued meanwhile starts long before the poll interval (60 s), the waiting
    # sends no claims (the second lane has no claim to go ahead of), and a stop
    # wakes the waiting thread (the worker is joined within 30 s).
    sent = {"claims": 0}

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            sent["claims"] += 1
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(claims, "claim", counted(claims.claim))
    monkeypatch.setattr(claims, "write_and_claim", counted(claims.write_and_claim))
    seen = "SELECT seen_at FROM rota.worker WHERE id = %s"
    with _running(
        db_url, _async_handlers(noop=_noop), concurrency=4, poll_interval_seconds=60,
        lease_seconds=3,
    ) as worker:  # fmt: skip
        for _ in range(5):  # fast jobs: the worker claims ahead after the fourth
            fast = rota.enqueue(conn, "noop")
            wait_for(lambda j=fast: row(conn, j)["status"] == "done", 20, "a job to be done")
        before = sent["claims"]
        first_seen = wait_for(lambda: conn.execute(seen, (worker.worker_id,)).fetchone(), 20)
        wait_for(
            lambda: conn.execute(seen, (worker.worker_id,)).fetchone() != first_seen,
            20,
            "a heartbeat of the idle worker (every second)",
        )
        assert worker.claims.claiming_ahead
        assert sent["claims"] - before <= 2
        job_id = rota.enqueue(conn, "noop")
        wait_for(lambda: row(conn, job_id)["status"] == "done", 20, "the next job to be done")


def test_an_idle_worker_starts_what_it_claimed_before_it_waits_again(
    conn, db_url, monkeypatch
) -> None:
    # An idle worker's claim returns a job: the job's handler takes its first step
    # before the next waiting claim goes to an I/O thread (handing it over wakes
    # that thread, which then takes the interpreter from the job's start).
    events: list[tuple[str, int | None]] = []
    real_run = Link.run

    async def run(self: Link, fn: Callable[..., Any], *args: Any) -> Any:
        if getattr(fn, "__name__", "") != "_claim_when_notified":
            return await real_run(self, fn, *args)
        events.append(("wait and claim", None))
        written, jobs = await real_run(self, fn, *args)
        events.extend(("claimed", job.id) for job in jobs)
        return written, jobs

    async def note(job: Job) -> None:
        events.append(("started", job.id))

    monkeypatch.setattr(Link, "run", run)
    with _running(db_url, _async_handlers(note=note), concurrency=2, poll_interval_seconds=60):
        wait_for(lambda: ("wait and claim", None) in events, 20, "the worker to wait for work")
        for _ in range(3):
            job_id = rota.enqueue(conn, "note")
            wait_for(lambda j=job_id: row(conn, j)["status"] == "done", 20, "the job to be done")
            at = events.index(("claimed", job_id))
            assert events[at + 1 : at + 3] == [("started", job_id), ("wait and claim", None)]


def test_a_failed_claim_is_logged_on_one_line(caplog) -> None:
    message = "server closed the connection unexpectedly\n\tThis probably means..."
    for exc in (DatabaseUnavailable(message), DatabaseError(message)):
        asyncio.run(wait_after(exc, Backoff(first=0.001), asyncio.Event()))
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and not [m for m in messages if "\n" in m]
