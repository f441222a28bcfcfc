"""Every enqueue is one round trip, sync or async, one job or a batch: counted
as the Sync messages psycopg sends (its libpq protocol trace). A single job
whose key is already held takes a second one, to read the holder's id (the
single-row INSERT returns nothing for it), as it always has; so does one whose
key is unique for a window or while active.

So is each of a worker's hot statements (a claim, outcomes with the next claim,
a heartbeat, outcomes alone) with the setting that goes with it: one
transaction, one round trip."""

from __future__ import annotations

import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import rota
from rota import claim as claims
from rota.claim import Attempt
from rota.jobs import Outcome

BATCH = [rota.NewJob("t", {"i": 1}), rota.NewJob("u", key="k", group="g")]


@contextmanager
def round_trips(conn: Any) -> Iterator[list[int]]:
    """How many round trips `conn` made inside the block (set when it ends)."""
    counted: list[int] = []
    with tempfile.TemporaryFile("w+b") as trace:
        conn.pgconn.trace(trace.fileno())
        try:
            yield counted
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode(errors="replace").splitlines()
    counted.append(sum(1 for line in lines if line.split("\t")[1:4:2] == ["F", "Sync"]))


def test_sync_enqueues_are_one_round_trip_each(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for call, trips in (
            (lambda: rota.enqueue(conn, "t", {"a": 1}, group="g"), 1),
            (lambda: rota.enqueue(conn, "t", key="once"), 1),
            (lambda: rota.enqueue(conn, "t", key="once"), 2),  # the key held: its id read
            (lambda: rota.enqueue_many(conn, BATCH), 1),
            (lambda: rota.enqueue_many(conn, BATCH), 1),  # keys held: a batch reads them
            (lambda: rota.enqueue(conn, "t", key="u", unique_active=True), 1),
            (lambda: rota.enqueue(conn, "t", key="u", unique_active=True), 2),  # its holder read
            (lambda: rota.enqueue(conn, "t", key="w", unique_for=60), 1),
            (lambda: rota.enqueue(conn, "t", key="w", unique_for=60), 2),
        ):
            with round_trips(conn) as made:
                call()
            assert made == [trips]


@pytest.mark.asyncio
async def test_async_enqueues_are_one_round_trip_each(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        calls: list[tuple[Callable[[], Awaitable[Any]], int]] = [
            (lambda: rota.enqueue_async(conn, "t", {"a": 1}, group="g"), 1),
            (lambda: rota.enqueue_async(conn, "t", key="once"), 1),
            (lambda: rota.enqueue_async(conn, "t", key="once"), 2),
            (lambda: rota.enqueue_many_async(conn, BATCH), 1),
            (lambda: rota.enqueue_many_async(conn, BATCH), 1),
            (lambda: rota.enqueue_async(conn, "t", key="u", unique_active=True), 1),
            (lambda: rota.enqueue_async(conn, "t", key="u", unique_active=True), 2),
            (lambda: rota.enqueue_async(conn, "t", key="w", unique_for=60), 1),
            (lambda: rota.enqueue_async(conn, "t", key="w", unique_for=60), 2),
        ]
        for call, trips in calls:
            with round_trips(conn) as made:
                await call()
            assert made == [trips]


def test_a_workers_hot_statements_are_one_round_trip_each(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(4)])
        with round_trips(conn) as made:
            [first] = claims.claim(conn, "w", 1, 30)
        assert made == [1]
        done = [Attempt.of(first, Outcome.DONE)]
        with round_trips(conn) as made:
            written, [second] = claims.write_and_claim(conn, "w", done, 1, 30)
        assert made == [1] and list(written) == [(first.id, 1)]
        with round_trips(conn) as made:
            [lease] = claims.extend_leases(conn, "w", {(second.id, 1)}, 30)
        assert made == [1] and lease.job_id == second.id
        with round_trips(conn) as made:
            claims.write_outcomes(conn, "w", [Attempt(second.id, 1, Outcome.DONE, claim=1)])
        assert made == [1]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_failed_statement_of_a_round_trip_writes_nothing_and_leaves_no_setting(
    db_url: str,
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        [job_id] = rota.enqueue_many(conn, [rota.NewJob("t")])
        [held] = claims.claim(conn, "w", 1, 30)
        rota.enqueue(conn, "t")
        done = [Attempt.of(held, Outcome.DONE)]
        # The outcome is written first; then the claim fails on the server (a lease
        # past what an interval holds), in the same implicit transaction.
        with pytest.raises(rota.DatabaseError, match="interval out of range"):
            claims.write_and_claim(conn, "w", done, 1, 1e300)
        # Neither the outcome nor the claim happened: the transaction rolled back whole.
        status = conn.execute("SELECT status FROM rota.job WHERE id = %s", (job_id,)).fetchone()
        ready = conn.execute("SELECT count(*) FROM rota.job WHERE status = 'ready'").fetchone()
        assert status == ("running",) and ready == (1,)
        settings = conn.execute(
            "SELECT current_setting('enable_seqscan'), current_setting('plan_cache_mode')"
        ).fetchone()
        assert settings == ("on", "auto")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
