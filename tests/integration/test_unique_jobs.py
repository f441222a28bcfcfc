"""Job groups and keys unique beyond the key: in a window (unique_for) and while
active (unique_active), alone, in batches, and under concurrent enqueues."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
import rota.control
from rota.claim import Attempt, claim, write_outcomes
from rota.errors import InvalidInput
from rota.jobs import Outcome
from tests.integration.test_flow_limits import wait_for_lock_wait

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def in_threads(n: int, target: Callable[[], object]) -> list[BaseException]:
    """Run `target` in `n` threads at once; the exceptions they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run) for _ in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    return errors


def count(conn: psycopg.Connection[Any], where: str = "true") -> int:
    return int(conn.execute(f"SELECT count(*) AS n FROM rota.job WHERE {where}").fetchone()["n"])  # type: ignore[index]


def test_group_is_stored_and_claimed_with_the_job(conn: psycopg.Connection[Any]) -> None:
    one = rota.enqueue(conn, "export", group="customer-1")
    [two, three] = rota.enqueue_many(
        conn, [rota.NewJob("export", group="customer-2"), rota.NewJob("export")]
    )
    groups = {r["id"]: r["group_key"] for r in conn.execute("SELECT id, group_key FROM rota.job")}
    assert groups == {one: "customer-1", two: "customer-2", three: None}
    jobs = claim(conn, "w", 10, 30)
    assert {j.id: j.group_key for j in jobs} == groups


def test_unique_for_gives_the_first_job_within_its_window(conn: psycopg.Connection[Any]) -> None:
    first = rota.enqueue(conn, "refresh", key="account-7", unique_for=3600, now=T0)
    again = rota.enqueue(
        conn, "refresh", key="account-7", unique_for=3600, now=T0 + timedelta(minutes=59)
    )
    assert again == first
    later = rota.enqueue(
        conn, "refresh", key="account-7", unique_for=3600, now=T0 + timedelta(hours=1)
    )
    assert later != first
    # The new job opened a window of its own.
    assert (
        rota.enqueue(conn, "refresh", key="account-7", unique_for=60, now=T0 + timedelta(hours=1))
        == later
    )
    assert count(conn) == 2


def test_unique_for_holds_even_after_the_job_finished(conn: psycopg.Connection[Any]) -> None:
    first = rota.enqueue(conn, "refresh", key="k", unique_for=3600, now=T0)
    [job] = claim(conn, "w", 1, 30, now=T0)
    write_outcomes(conn, "w", [Attempt(job.id, job.attempts, Outcome.DONE)], now=T0)
    assert rota.enqueue(conn, "refresh", key="k", unique_for=3600, now=T0) == first


def test_unique_active_holds_while_ready_or_running_only(conn: psycopg.Connection[Any]) -> None:
    first = rota.enqueue(conn, "sync", key="acct", unique_active=True)
    assert rota.enqueue(conn, "sync", key="acct", unique_active=True) == first
    [job] = claim(conn, "w", 1, 30)
    assert rota.enqueue(conn, "sync", key="acct", unique_active=True) == first  # running
    write_outcomes(conn, "w", [Attempt(job.id, job.attempts, Outcome.DONE)])
    second = rota.enqueue(conn, "sync", key="acct", unique_active=True)
    assert second != first
    assert count(conn, "status = 'ready'") == 1


def test_unique_keys_do_not_clash_with_idempotency_keys(conn: psycopg.Connection[Any]) -> None:
    plain = rota.enqueue(conn, "t", key="same")
    active = rota.enqueue(conn, "t", key="same", unique_active=True)
    window = rota.enqueue(conn, "t", key="same", unique_for=60)
    assert len({plain, active, window}) == 3


def test_batches_mix_unique_and_plain_jobs_in_input_order(conn: psycopg.Connection[Any]) -> None:
    held = rota.enqueue(conn, "t", key="a", unique_active=True)
    ids = rota.enqueue_many(
        conn,
        [
            rota.NewJob("t", {"i": 0}),
            rota.NewJob("t", {"i": 1}, key="a", unique_active=True),
            rota.NewJob("t", {"i": 2}, key="b", unique_for=60),
            rota.NewJob("t", {"i": 3}, key="b", unique_for=60),
            rota.NewJob("t", {"i": 4}, key="c", unique_active=True),
            rota.NewJob("t", {"i": 5}, key="c", unique_active=True),
            rota.NewJob("t", {"i": 6}, group="g"),
        ],
    )
    assert ids[1] == held
    assert ids[2] == ids[3] and ids[4] == ids[5]
    payloads = {r["id"]: r["payload"] for r in conn.execute("SELECT id, payload FROM rota.job")}
    assert [payloads[i] for i in ids] == [{"i": n} for n in (0, 2, 2, 4, 4, 6)][:1] + [{}] + [
        {"i": n} for n in (2, 2, 4, 4, 6)
    ]


def test_a_batch_is_all_or_nothing_with_unique_jobs(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidInput):
        rota.enqueue_many(
            conn,
            [rota.NewJob("t", key="a", unique_active=True), rota.NewJob("t", key="", group="g")],
        )
    assert count(conn) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unique_for": 60}, "need a key"),
        ({"unique_active": True}, "need a key"),
        ({"key": "k", "unique_for": 60, "unique_active": True}, "not both"),
        ({"key": "k", "unique_for": 0}, "more than 0"),
        ({"key": "k", "unique_for": float("nan")}, "number"),
        ({"key": "k", "unique_for": 1e12}, "at most"),
        ({"key": "k", "unique_active": "yes"}, "True or False"),
        ({"group": ""}, "non-empty"),
        ({"group": 5}, "non-empty"),
        ({"group": "a\x00b"}, "NUL"),
    ],
)
def test_bad_flow_input_is_refused_before_anything_is_written(
    conn: psycopg.Connection[Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        rota.enqueue(conn, "t", **kwargs)
    assert count(conn) == 0


@pytest.mark.parametrize("mode", ["unique_for", "unique_active"])
def test_concurrent_enqueues_of_one_key_make_one_job(db_url: str, mode: str) -> None:
    """Many connections enqueue the same key at the same instant: one job."""
    threads = 12
    start = threading.Barrier(threads)
    ids: list[int] = []
    kwargs: dict[str, Any] = (
        {"unique_for": 600} if mode == "unique_for" else {"unique_active": True}
    )

    def enqueue_one() -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            start.wait(timeout=30)
            for _ in range(5):
                ids.append(rota.enqueue(c, "t", key="hot", **kwargs))
                ids.append(rota.enqueue_many(c, [rota.NewJob("t", key="hot", **kwargs)])[0])

    assert not in_threads(threads, enqueue_one)
    assert len(ids) == threads * 10 and len(set(ids)) == 1
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM rota.job").fetchone() == (1,)


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_concurrent_enqueues_in_open_transactions_wait_for_the_holder(
    db_url: str, outcome: str
) -> None:
    """A second enqueue of a key held by an uncommitted job waits, then gives its id;
    if the holder rolls back, the second makes the job."""
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url) as other:
        first = rota.enqueue(holder, "t", key="k", unique_for=600)
        result: list[int] = []
        waiter = threading.Thread(
            target=lambda: result.append(rota.enqueue(other, "t", key="k", unique_for=600))
        )
        waiter.start()
        wait_for_lock_wait(db_url)
        getattr(holder, outcome)()
        waiter.join(timeout=30)
        other.commit()
        assert (result[0] == first) == (outcome == "commit")


def test_retrying_ended_jobs_never_makes_two_active_jobs_with_a_key(
    conn: psycopg.Connection[Any],
) -> None:
    """A dead unique_active job is revived only while no other job holds its key,
    and of two ended jobs with one key, one is revived."""
    first = rota.enqueue(conn, "sync", key="acct", unique_active=True)
    conn.execute("UPDATE rota.job SET status = 'dead', finished_at = now() WHERE id = %s", (first,))
    second = rota.enqueue(conn, "sync", key="acct", unique_active=True)
    assert second != first
    assert rota.control.retry(conn, [first]) == []  # the key is held by the second
    conn.execute(
        "UPDATE rota.job SET status = 'dead', finished_at = now() WHERE id = %s", (second,)
    )
    revived = rota.control.retry(conn, [first, second])
    assert len(revived) == 1
    assert count(conn, "status = 'ready'") == 1
    assert rota.enqueue(conn, "sync", key="acct", unique_active=True) == revived[0]


@pytest.mark.asyncio
async def test_async_enqueues_keep_unique_keys_as_the_sync_ones_do(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        first = await rota.enqueue_async(c, "refresh", key="acct", unique_for=3600, now=T0)
        within = T0 + timedelta(minutes=59)
        assert (
            await rota.enqueue_async(c, "refresh", key="acct", unique_for=3600, now=within) == first
        )
        after = T0 + timedelta(hours=1)
        later = await rota.enqueue_async(c, "refresh", key="acct", unique_for=3600, now=after)
        assert later != first
        active = await rota.enqueue_async(c, "sync", key="a", unique_active=True)
        batch = [
            rota.NewJob("sync", key="a", unique_active=True),
            rota.NewJob("plain"),
            rota.NewJob("refresh", key="acct", unique_for=3600),
        ]
        ids = await rota.enqueue_many_async(c, batch, now=after)
        assert ids[0] == active and ids[2] == later and len(set(ids)) == 3
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as s:
        [job] = claim(s, "w", 1, 30, types=["sync"])
        write_outcomes(s, "w", [Attempt(job.id, job.attempts, Outcome.DONE)])
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            assert await rota.enqueue_async(c, "sync", key="a", unique_active=True) != active
        assert count(s) == 5


@pytest.mark.asyncio
async def test_an_async_batch_is_all_or_nothing_with_unique_jobs(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        with pytest.raises(InvalidInput):
            await rota.enqueue_many_async(
                c,
                [
                    rota.NewJob("t", key="a", unique_active=True),
                    rota.NewJob("t", key="", group="g"),
                ],
            )
        with pytest.raises(InvalidInput, match="need a key"):
            await rota.enqueue_async(c, "t", unique_for=60)
    with psycopg.connect(db_url, row_factory=dict_row) as s:
        assert count(s) == 0


@pytest.mark.parametrize("mode", ["unique_for", "unique_active"])
def test_concurrent_async_enqueues_of_one_key_make_one_job(db_url: str, mode: str) -> None:
    """Many event loops, each on its own connection, enqueue the same key at once:
    one job, and every call (one job or a batch) gives its id."""
    threads = 8
    start = threading.Barrier(threads)
    ids: list[int] = []
    kwargs: dict[str, Any] = (
        {"unique_for": 600} if mode == "unique_for" else {"unique_active": True}
    )

    async def enqueue_some() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            start.wait(timeout=30)
            for _ in range(5):
                together = await asyncio.gather(
                    rota.enqueue_async(db_url, "t", key="hot", **kwargs),
                    rota.enqueue_many_async(
                        c, [rota.NewJob("t", key="hot", **kwargs), rota.NewJob("other")]
                    ),
                )
                ids.extend([together[0], together[1][0]])

    assert not in_threads(threads, lambda: asyncio.run(enqueue_some()))
    assert len(ids) == threads * 10 and len(set(ids)) == 1
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM rota.job WHERE type = 't'").fetchone() == (1,)


@pytest.mark.asyncio
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_an_async_enqueue_waits_for_a_holder_in_an_open_transaction(
    db_url: str, outcome: str
) -> None:
    """The interleaving made, not hoped for: the holder's job is uncommitted while
    the async enqueue of its key runs; it waits, then gives the holder's id (or,
    when the holder rolls back, makes the job)."""
    with psycopg.connect(db_url) as holder:
        first = rota.enqueue(holder, "t", key="k", unique_active=True)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            waiting = asyncio.ensure_future(rota.enqueue_async(c, "t", key="k", unique_active=True))
            await asyncio.to_thread(wait_for_lock_wait, db_url)
            getattr(holder, outcome)()
            got = await asyncio.wait_for(waiting, 30)
        assert (got == first) == (outcome == "commit")
