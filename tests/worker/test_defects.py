"""Defects a hostile user found without any crash, each pinned by a test that
failed before its fix: a job claimed again in the statement that gave it back,
error messages PostgreSQL cannot store, handlers raising CancelledError or a
BaseException, the shutdown past its grace, the reaper's retry time, and the two
kinds of database error."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import rota
from rota import claim as claims
from rota import db
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.handlers import Handler
from rota.jobs import Job, Outcome
from rota.reaper import Reaper, ReaperSettings
from rota.schedule_store import ScheduleSpec
from rota.schedule_store import upsert as upsert_schedule
from rota.scheduler import Scheduler
from rota.settings import BackoffSettings
from rota_worker.execute import outcome_of_error
from rota_worker.link import Link
from rota_worker.settings import WorkerSettings
from rota_worker.slots import AHEAD_MAX_WAIT_SECONDS
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _noop, _running, row


def test_a_job_given_back_and_claimed_again_in_one_statement_stays_held(conn, db_url) -> None:
    # A job claimed ahead waited too long and is given back; the claim that
    # carries that outcome picks the same job again, at the same attempt number.
    # The new attempt is a new record: settling the old one must not let go of it.
    rota.enqueue(conn, "t")
    worker = Worker(
        db_url,
        WorkerSettings(concurrency=1, run_reaper=False, run_scheduler=False, lease_seconds=600),
        handlers=_async_handlers(t=_noop),
    )
    slots, attempts, buffer = worker.slots, worker.attempts, worker.outcomes
    io = ThreadPoolExecutor(1)

    async def scenario() -> None:
        link = Link(db_url, "claim", io)
        worker.leases.loop = asyncio.get_running_loop()
        try:
            (job,) = await link.run(claims.claim, worker.worker_id, 1, 600, ["t"])
            slots.hold([job])
            (old,) = attempts.snapshot()
            assert slots.give_back_stale(old.held_at + AHEAD_MAX_WAIT_SECONDS) == 1
            batch = buffer.take()
            written, again = await link.run(
                claims.write_and_claim, worker.worker_id, buffer.to_write(batch), 1, 600, ["t"]
            )
            assert [(j.id, j.attempts) for j in again] == [(job.id, job.attempts)]
            slots.hold(again)
            new = attempts.snapshot()[-1]
            await buffer.settle(link, batch, written)
            held = attempts.snapshot()
            assert any(e is new for e in held) and not any(e is old for e in held)
            before = row(conn, job.id)["locked_until"]
            await asyncio.get_running_loop().run_in_executor(None, worker.leases.step)
            await asyncio.sleep(0)
            assert row(conn, job.id)["locked_until"] > before  # its lease renewal goes on
            assert new.stopped is None
        finally:
            link.close()
            worker.leases.close()

    try:
        asyncio.run(scenario())
    finally:
        io.shutdown()


def _dead(conn: psycopg.Connection[Any], n: int) -> bool:
    return (
        conn.execute("SELECT count(*) AS n FROM rota.job WHERE status = 'dead'").fetchone()["n"]
        == n
    )


def test_an_error_message_postgresql_cannot_store_is_escaped(conn, db_url) -> None:
    # A non-UTF-8 file name decoded by os.fsdecode carries a lone surrogate: written
    # as it was, the outcome could not even be encoded and the worker exited.
    name = os.fsdecode(b"report-\xff.csv")

    async def surrogate(job: Job) -> None:
        raise ValueError(f"cannot read {name}")

    def surrogate_sync(job: Job) -> None:
        raise rota.Retry(reason=f"later: {name}\x00")

    handlers = {
        **_async_handlers(surrogate=surrogate, noop=_noop),
        "sync": Handler("sync", surrogate_sync, is_async=False, wants_context=False),
    }
    one = rota.enqueue(conn, "surrogate", max_attempts=1)
    two = rota.enqueue(conn, "sync", max_attempts=1)
    with _running(db_url, handlers, concurrency=2):
        wait_for(lambda: _dead(conn, 2), 20, "both to be dead")
        assert row(conn, one)["last_error"].startswith("ValueError: cannot read report-\\udcff.csv")
        assert row(conn, two)["last_error"].startswith("Retry: later: report-\\udcff.csv\\x00")
        good = rota.enqueue(conn, "noop")
        wait_for(lambda: row(conn, good)["status"] == "done", 20, "the next job to be done")


class Boom(BaseException):
    """Not an Exception: a handler's own BaseException."""


def test_handlers_raising_cancelled_error_or_a_base_exception_end_as_retries(conn, db_url) -> None:
    # A handler that raises CancelledError itself (nobody stopped it) kept its slot
    # for the life of the worker: with one slot, the next job never ran.
    async def cancels(job: Job) -> None:
        raise asyncio.CancelledError()

    def cancels_sync(job: Job) -> None:
        raise asyncio.CancelledError()

    async def booms(job: Job) -> None:
        raise Boom("out of the blue")

    handlers = {
        **_async_handlers(cancels=cancels, booms=booms, noop=_noop),
        "cancels_sync": Handler("cancels_sync", cancels_sync, is_async=False, wants_context=False),
    }
    ids = [rota.enqueue(conn, t, max_attempts=2) for t in ("cancels", "cancels_sync", "booms")]
    with _running(db_url, handlers, concurrency=1, reconnect_max_seconds=0.2):
        for job_id in ids:
            wait_for(lambda j=job_id: row(conn, j)["attempts"] == 1, 20, "a first attempt")
            wait_for(lambda j=job_id: row(conn, j)["status"] != "running", 20, "its outcome")
            after = row(conn, job_id)
            assert (after["status"], after["releases"]) == ("ready", 0)  # a retry, counted
            assert after["run_at"] > after["started_at"]  # after its backoff
        errors = [row(conn, i)["last_error"].splitlines()[0] for i in ids]
        assert errors[0].startswith("CancelledError: the handler raised it")
        assert errors[1].startswith("CancelledError: the handler raised it")
        assert errors[2] == "Boom: out of the blue"
        good = rota.enqueue(conn, "noop")
        wait_for(lambda: row(conn, good)["status"] == "done", 20, "the next job in the one slot")


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


NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_the_reaper_retries_an_expired_job_after_its_backoff(conn) -> None:
    # A job that kills its worker (OOM, say) came back at once, up to 20 times,
    # each crash expiring every job beside it: it backs off like a failing job.
    ids = rota.enqueue_many(conn, [rota.NewJob("t"), rota.NewJob("t")])
    conn.execute("UPDATE rota.job SET attempts = 3, run_at = %s", (NOW,))
    claims.claim(conn, "w", 2, 30, now=NOW)  # attempt 4 of each
    later = NOW + timedelta(seconds=31)
    fixed = BackoffSettings(base_seconds=10, cap_seconds=3600, jitter=0)
    result = Reaper(ReaperSettings(backoff=fixed)).run_once(conn, now=later)
    assert sorted(result.requeued) == sorted(ids)
    assert [row(conn, i)["run_at"] for i in ids] == [later + timedelta(seconds=80)] * 2
    assert [row(conn, i)["attempts"] for i in ids] == [4, 4]  # still counted
    # The default backoff (1 s doubled, a quarter of jitter either way).
    rota.enqueue(conn, "u")
    conn.execute("UPDATE rota.job SET run_at = %s WHERE type = 'u'", (NOW,))
    (job,) = claims.claim(conn, "w", 1, 30, ["u"], now=NOW)
    Reaper().run_once(conn, now=later)
    wait = (row(conn, job.id)["run_at"] - later).total_seconds()
    assert 0.75 <= wait <= 1.25


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (psycopg.OperationalError("connection to server failed: Connection refused"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (psycopg.errors.AdminShutdown(), True),
        (psycopg.errors.ReadOnlySqlTransaction(), True),
        (psycopg.errors.TooManyConnections(), True),
        (psycopg.errors.QueryCanceled(), False),  # a statement timeout
        (psycopg.errors.DeadlockDetected(), False),
        (psycopg.errors.LockNotAvailable(), False),  # a lock timeout
        (psycopg.errors.ProgramLimitExceeded(), False),  # index row size exceeds maximum
        (psycopg.errors.NumericValueOutOfRange(), False),
    ],
)
def test_an_outage_is_never_an_attempt_and_a_refused_statement_is_one(error, outage) -> None:
    assert db.is_unavailable(error) is outage
    job = Job(1, "t", {}, None, rota.Status.RUNNING, NOW, 1, 20)
    expected = Outcome.RELEASED if outage else Outcome.RETRY
    assert outcome_of_error(job, error, BackoffSettings()).outcome is expected


def test_a_statement_timeout_is_a_refusal_not_an_outage(conn) -> None:
    conn.execute("SET statement_timeout = '10ms'")
    with pytest.raises(DatabaseError, match="QueryCanceled"):
        db.fetch_all(conn, "SELECT pg_sleep(1)")
    with pytest.raises(DatabaseUnavailable):
        db.fetch_all(conn, "SELECT pg_terminate_backend(pg_backend_pid())")


def test_one_schedule_the_database_refuses_stops_no_other(conn, caplog) -> None:
    # A job type too long for the index (stored by hand): its enqueue is refused.
    # The scheduler logs it, moves that schedule past the slot, and goes on.
    for name in ("a-bad", "b-good"):
        upsert_schedule(conn, ScheduleSpec(name, "t", "0 * * * *"), now=NOW)
    conn.execute(
        "UPDATE rota.schedule SET job_type ="
        " (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) AS i)"
        " WHERE name = 'a-bad'"
    )
    tick = NOW + timedelta(hours=1, minutes=1)
    result = Scheduler().run_once(conn, now=tick)
    assert result.enqueued == 1
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 1
    bad = conn.execute("SELECT * FROM rota.schedule WHERE name = 'a-bad'").fetchone()
    assert bad["next_run_at"] > tick
    assert "schedule 'a-bad'" in caplog.text and "refused" in caplog.text
