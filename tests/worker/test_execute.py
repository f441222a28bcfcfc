"""How a handler's end becomes an outcome (`rota_worker.execute`): an error
message PostgreSQL cannot store is escaped, a handler raising CancelledError or
a BaseException of its own ends as a retry, and an error from the database is
an outage (the job given back, no attempt counted) or a refusal (a retry)."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

import rota
from rota import db
from rota.errors import DatabaseError, DatabaseUnavailable
from rota.handlers import Handler
from rota.jobs import Job, Outcome
from rota.settings import BackoffSettings
from rota_worker.execute import outcome_of_error
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _noop, _running, row

NOW = datetime(2030, 1, 1, tzinfo=UTC)


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
