"""The outcome buffer against a real database: batches written and settled, lost
leases told from jobs the handler completed itself, one outcome the database
refuses holding back no other, and a refusal that passes (a lock) giving up none."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import rota
from rota import claim as claims
from rota.attempt import Attempt
from rota.jobs import Job, Outcome
from rota_worker.attempts import Attempts, Event, Execution, State
from rota_worker.link import Link
from rota_worker.outcomes import OutcomeBuffer
from tests.worker.helpers import row


@pytest.fixture
def io() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown(wait=True)


def _buffer(batch_size: int) -> tuple[OutcomeBuffer, list[int]]:
    """A buffer fed by its own attempts' owner; the ids settled, in order."""
    owner = Attempts(concurrency=10, lease_seconds=30)
    buffer = OutcomeBuffer("w", batch_size, owner)
    settled: list[int] = []
    owner.ended = lambda record, was: buffer.add(record)
    owner.settled = lambda record: settled.append(record.job.id)
    return buffer, settled


def _ended(buffer: OutcomeBuffer, job: Job, outcome: Attempt) -> Execution:
    record = buffer.attempts.claimed(job, None, 0.0)
    buffer.attempts.dispatch(record, Event.STARTED)
    record.outcome = outcome
    buffer.attempts.dispatch(record, Event.FINISHED)
    return record


def _flush_all(buffer: OutcomeBuffer, db_url: str, io: ThreadPoolExecutor) -> None:
    """Flush `buffer` on a link of its own until nothing is pending."""

    async def flush_all() -> None:
        link = Link(db_url, "flush", io)
        try:
            while buffer.pending:
                await buffer.flush(link)
        finally:
            link.close()

    asyncio.run(flush_all())


def test_the_buffer_writes_a_batch_and_tells_lost_from_self_completed(conn, db_url, io) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(4)])
    jobs = {j.id: j for j in claims.claim(conn, "w", 10, 30)}
    conn.execute("UPDATE rota.job SET locked_by = 'thief' WHERE id = %s", (ids[2],))
    with psycopg.connect(db_url, autocommit=True) as own:
        assert rota.complete(own, jobs[ids[3]])  # done in the handler's own transaction
    buffer, settled = _buffer(batch_size=3)
    outcomes = [Outcome.DONE, Outcome.RETRY, Outcome.DONE, Outcome.DONE]
    records = [
        _ended(buffer, jobs[i], Attempt.of(jobs[i], outcome, 60, "boom", type="t"))
        for i, outcome in zip(ids, outcomes, strict=True)
    ]

    _flush_all(buffer, db_url, io)
    assert settled == ids  # every attempt accounted for, in order
    assert buffer.written == 4 and buffer.unsettled == 0
    assert [r.state for r in records] == [State.WRITTEN, State.WRITTEN, State.LOST, State.WRITTEN]
    statuses = [row(conn, i)["status"] for i in ids]
    assert statuses == ["done", "ready", "running", "done"]  # the stolen one untouched
    assert row(conn, ids[2])["locked_by"] == "thief"


def test_a_self_completed_jobs_return_value_is_stored_unless_complete_stored_one(
    conn, db_url, io
) -> None:
    """A handler that completes its job in its own transaction and returns a
    value: the worker's outcome finds the row done, and stores the value."""
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)])
    jobs = {j.id: j for j in claims.claim(conn, "w", 10, 30)}
    with psycopg.connect(db_url, autocommit=True) as own:
        assert rota.complete(own, jobs[ids[0]])
        assert rota.complete(own, jobs[ids[1]], result={"given": "to complete"})
    buffer, settled = _buffer(batch_size=10)
    for job_id in ids:
        attempt = Attempt.of(jobs[job_id], Outcome.DONE, type="t", result='{"returned": 1}')
        _ended(buffer, jobs[job_id], attempt)

    _flush_all(buffer, db_url, io)
    assert settled == ids
    results = [row(conn, i)["result"] for i in ids]
    assert results == [{"returned": 1}, {"given": "to complete"}, {"returned": 1}]


def test_an_outcome_the_database_refuses_holds_back_no_other(conn, db_url, io) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(4)])
    jobs = {j.id: j for j in claims.claim(conn, "w", 10, 30)}
    buffer, settled = _buffer(batch_size=10)
    for job_id in ids:
        # Built by hand: describe_error would have shown the NUL as \x00.
        error = "bad\x00byte" if job_id == ids[1] else "boom"
        _ended(buffer, jobs[job_id], Attempt.of(jobs[job_id], Outcome.RETRY, 60, error, type="t"))

    async def write_all() -> None:
        link = Link(db_url, "flush", io)
        writer = asyncio.create_task(buffer.run(link))
        try:
            await buffer.attempts.settled_all()
            assert not writer.done()
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            link.close()

    asyncio.run(asyncio.wait_for(write_all(), 30))
    assert sorted(settled) == sorted(ids)
    assert buffer.written == 4
    statuses = [row(conn, i)["status"] for i in ids]
    assert statuses == ["ready", "running", "ready", "ready"]  # the refused one: nothing written


def test_an_outcome_whose_row_is_locked_for_a_while_waits_and_is_written_once(
    conn, db_url, io, monkeypatch
) -> None:
    # A lock not had within the lock timeout says nothing about the outcome:
    # it is tried again (the lease still held), not given up.
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(2)])
    jobs = {j.id: j for j in claims.claim(conn, "w", 10, 30)}
    buffer, settled = _buffer(batch_size=10)
    for job_id in ids:
        _ended(buffer, jobs[job_id], Attempt.of(jobs[job_id], Outcome.DONE, 60, None, type="t"))
    tries: list[int] = []
    write = claims.write_outcomes

    def counted(*args, **kwargs):
        tries.append(1)
        return write(*args, **kwargs)

    monkeypatch.setattr(claims, "write_outcomes", counted)
    short_lock = make_conninfo(db_url, options="-c lock_timeout=100ms")

    async def write_all(locker: psycopg.Connection) -> None:
        link = Link(short_lock, "flush", io)
        writer = asyncio.create_task(buffer.run(link))
        try:
            while len(tries) < 3:  # refused, tried again and refused again
                await asyncio.sleep(0.01)
            assert not settled
            locker.rollback()
            await buffer.attempts.settled_all()
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            link.close()

    with psycopg.connect(db_url) as locker:
        locker.execute("SELECT FROM rota.job WHERE id = %s FOR UPDATE", (ids[0],))
        asyncio.run(asyncio.wait_for(write_all(locker), 60))
    assert sorted(settled) == sorted(ids)
    assert [row(conn, i)["status"] for i in ids] == ["done", "done"]


def test_outcomes_waiting_for_the_database_are_logged_on_one_line(conn, db_url, io, caplog) -> None:
    # libpq's "connection refused" runs over two lines; a log record must not.
    rota.enqueue(conn, "t")
    (job,) = claims.claim(conn, "w", 1, 30)
    buffer, _ = _buffer(batch_size=10)
    _ended(buffer, job, Attempt.of(job, Outcome.DONE, 60, None, type="t"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = make_conninfo(db_url, port=s.getsockname()[1], connect_timeout=2)

    async def try_once() -> None:
        link = Link(closed, "flush", io)
        writer = asyncio.create_task(buffer.run(link))
        try:
            while not caplog.records:
                await asyncio.sleep(0.01)
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            link.close()

    asyncio.run(asyncio.wait_for(try_once(), 30))
    (message,) = {record.getMessage() for record in caplog.records}
    assert "outcomes wait for the database" in message and "\n" not in message
    assert "accepting TCP/IP connections" in message  # libpq's second line, joined
