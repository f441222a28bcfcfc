"""A run borrows its connection from the worker's RunConnections and gives it back."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import rota
from rota.claim import claim
from rota.durable import Run, RunConnections
from rota.errors import Cancelled, LeaseLost
from rota.jobs import Job
from tests.durable.helpers import handlers as durable_handlers
from tests.durable.helpers import running, until_status


@pytest.fixture
def connections(db_url: str) -> Iterator[RunConnections]:
    made = RunConnections(db_url, 2)
    yield made
    made.close()


def _claimed(conn) -> Job:
    rota.enqueue(conn, "t")
    [job] = claim(conn, "w", 1, 60)
    return job


def _backend(run: Run) -> int:
    """The server process behind the run's connection."""
    return int(run._own().info.backend_pid)


def test_runs_one_after_another_share_a_connection(conn, db_url, connections) -> None:
    first = Run(db_url, "w", _claimed(conn), connections)
    assert first.step("a", lambda: 1) == 1
    pid = _backend(first)
    first.close()

    second = Run(db_url, "w", _claimed(conn), connections)
    assert second.step("a", lambda: 2) == 2
    assert _backend(second) == pid
    second.close()


def test_a_connection_handed_to_a_handler_is_not_kept(conn, db_url, connections) -> None:
    lent = Run(db_url, "w", _claimed(conn), connections)
    lent.conn.execute("SET statement_timeout = '1234ms'")
    lent.conn.execute("CREATE TABLE left_open (n int)")  # never committed
    pid = _backend(lent)
    lent.close()

    after = Run(db_url, "w", _claimed(conn), connections)
    after.step("a", lambda: 1)
    assert _backend(after) != pid
    setting = after._own().execute("SHOW statement_timeout").fetchone()
    assert setting == {"statement_timeout": "0"}
    after.close()
    assert conn.execute("SELECT to_regclass('left_open') AS t").fetchone() == {"t": None}


def test_a_connection_handed_to_a_handler_ends_without_a_warning(
    conn, db_url, connections, caplog
) -> None:
    # Every job that used ctx.conn logged psycopg's "discarding closed connection".
    caplog.set_level(logging.INFO)
    for _ in range(2):
        lent = Run(db_url, "w", _claimed(conn), connections)
        lent.step("a", lambda: 1)
        lent.conn.execute("SELECT 1")
        lent.step("b", lambda: 2)
        lent.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == []
    assert connections._pool is not None
    stats = connections._pool.get_stats()
    assert stats.get("pool_size") == stats.get("pool_available") == 1


def test_a_step_that_raised_leaves_nothing_open_for_the_next_run(conn, db_url, connections) -> None:
    def fails() -> None:
        raise RuntimeError("inside the step")

    failed = Run(db_url, "w", _claimed(conn), connections)
    with pytest.raises(RuntimeError):
        failed.step("a", fails)
    failed.close()

    job = _claimed(conn)
    after = Run(db_url, "w", job, connections)
    assert after.step("a", lambda: "stored") == "stored"
    after.close()
    stored = conn.execute(
        "SELECT result FROM rota.job_step WHERE job_id = %s AND name = 'a'", (job.id,)
    ).fetchone()
    assert stored == {"result": "stored"}


def test_a_run_still_going_when_the_worker_stops_gets_its_own_connection(
    conn, db_url, connections
) -> None:
    going = Run(db_url, "w", _claimed(conn), connections)
    going.step("a", lambda: 1)
    connections.close()
    going.close()  # its borrowed connection is closed, not kept

    late = Run(db_url, "w", _claimed(conn), connections)
    assert late.step("a", lambda: 2) == 2
    late.close()


def test_a_durable_call_after_its_run_ended_borrows_no_connection(conn, db_url) -> None:
    # An async handler's durable call runs in a thread, which goes on when the
    # handler ends without it (it raised beside an `asyncio.gather` of spawns,
    # its task was cancelled): such a call may come after its run has ended.
    connections = RunConnections(db_url, 1)
    try:
        ended = Run(db_url, "w", _claimed(conn), connections)
        ended.step("a", lambda: 1)
        ended.close()
        with pytest.raises(Cancelled, match="its run has ended"):
            ended.spawn("c", {"v": 1})
        children = conn.execute("SELECT id FROM rota.job WHERE parent_id IS NOT NULL")
        assert children.fetchall() == []
        # The pool's one connection is free for the next run (else it waits 30 s).
        after = Run(db_url, "w", _claimed(conn), connections)
        assert after.step("a", lambda: 2) == 2
        after.close()
    finally:
        connections.close()


@pytest.mark.parametrize("lent", [False, True], ids=["own statements", "through run.conn"])
def test_a_step_after_its_lease_was_taken_stores_nothing_and_undoes_its_writes(
    conn, db_url, connections, lent: bool
) -> None:
    conn.execute("CREATE TABLE effect (step text)")
    job = _claimed(conn)
    run = Run(db_url, "w", job, connections)

    def write(step: str) -> str:
        if lent:
            run.conn.execute("INSERT INTO effect VALUES (%s)", (step,))
        return step

    assert run.step("a", write, "a") == "a"
    conn.execute("UPDATE rota.job SET locked_by = 'another' WHERE id = %s", (job.id,))
    with pytest.raises(LeaseLost):
        run.step("b", write, "b")
    run.close()
    stored = conn.execute("SELECT name FROM rota.job_step WHERE job_id = %s", (job.id,))
    assert [r["name"] for r in stored] == ["a"]
    effects = [r["step"] for r in conn.execute("SELECT step FROM effect").fetchall()]
    assert effects == (["a"] if lent else [])


def test_a_spawn_after_its_lease_was_taken_makes_no_child(conn, db_url, connections) -> None:
    # A run that lost its job to another worker spawned all the same.
    job = _claimed(conn)
    run = Run(db_url, "w", job, connections)
    first = run.spawn("c", {"v": 1}, name="first")
    conn.execute("UPDATE rota.job SET locked_by = 'another' WHERE id = %s", (job.id,))
    with pytest.raises(LeaseLost):
        run.spawn("c", {"v": 2}, name="second")
    run.close()
    children = conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (job.id,))
    assert [r["id"] for r in children] == [first]


def test_durable_calls_at_once_on_one_run_share_its_one_connection(conn, db_url) -> None:
    connections = RunConnections(db_url, 6)
    run = Run(db_url, "w", _claimed(conn), connections)
    start = threading.Barrier(6)

    def spawn(i: int) -> int:
        start.wait(10)
        return run.spawn("c", {"v": i}, name=f"c{i}")

    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            ids = list(pool.map(spawn, range(6)))
        run.close()
        assert len(set(ids)) == 6
        stats = connections._pool.get_stats() if connections._pool else {}
        assert stats.get("requests_num") == 1
        assert stats.get("pool_size") == stats.get("pool_available") == 1
    finally:
        connections.close()


async def spawns_at_once(job: Job, ctx: rota.Context) -> Any:
    return await asyncio.gather(*[ctx.spawn("c", {"v": i}) for i in range(5)])


def test_an_async_handler_gathers_its_spawns_without_losing_connections(conn, db_url) -> None:
    handlers = durable_handlers(spawns_at_once=spawns_at_once)
    first = rota.enqueue(conn, "spawns.at.once")
    with running(db_url, handlers, concurrency=1) as worker:
        ids = until_status(conn, first, "done")["result"]
        assert len(set(ids)) == 5
        second = rota.enqueue(conn, "spawns.at.once")
        assert until_status(conn, second, "done")["result"] != ids
        pool = worker.context.connections._pool
        assert pool is not None
        stats = pool.get_stats()
        assert stats.get("pool_size") == stats.get("pool_available") == 1
