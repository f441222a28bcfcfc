"""Job groups and keys unique beyond the key: in a window (unique_for) and while
active (unique_active), alone, in batches, and under concurrent enqueues."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
import rota.control
from rota import schedule_store
from rota.archive import Archiver, ArchiveSettings
from rota.claim import Attempt, claim, write_outcomes
from rota.errors import InvalidInput
from rota.jobs import Outcome
from rota.schedule_store import ScheduleSpec
from rota.scheduler import Scheduler
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
    write_outcomes(conn, "w", [Attempt.of(job, Outcome.DONE)], now=T0)
    assert rota.enqueue(conn, "refresh", key="k", unique_for=3600, now=T0) == first


def test_unique_active_holds_while_ready_or_running_only(conn: psycopg.Connection[Any]) -> None:
    first = rota.enqueue(conn, "sync", key="acct", unique_active=True)
    assert rota.enqueue(conn, "sync", key="acct", unique_active=True) == first
    [job] = claim(conn, "w", 1, 30)
    assert rota.enqueue(conn, "sync", key="acct", unique_active=True) == first  # running
    write_outcomes(conn, "w", [Attempt.of(job, Outcome.DONE)])
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
        write_outcomes(s, "w", [Attempt.of(job, Outcome.DONE)])
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


# -- keys whose window has passed are deleted by the archiver -------------------------

NO_GRACE = ArchiveSettings(unique_key_retention_seconds=0)
"""The archiver deleting keys the moment their window has passed."""


def unique_keys(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute("SELECT key, job_id FROM rota.job_unique_key").fetchall()
    return {r["key"]: r["job_id"] for r in rows}  # type: ignore[call-overload]


def test_the_archiver_deletes_keys_whose_window_has_passed_in_batches(
    conn: psycopg.Connection[Any],
) -> None:
    for i in range(5):
        rota.enqueue(conn, "t", key=f"old-{i}", unique_for=60, now=T0)
    live = rota.enqueue(conn, "t", key="live", unique_for=7200, now=T0)
    settings = ArchiveSettings(unique_key_retention_seconds=600, batch_size=2)
    kept = Archiver(settings).run_once(conn, now=T0 + timedelta(seconds=660))
    assert kept.keys == 0 and len(unique_keys(conn)) == 6  # passed, but within the retention
    later = T0 + timedelta(seconds=661)
    capped = Archiver(dataclasses.replace(settings, max_batches=2)).run_once(conn, now=later)
    assert (capped.keys, capped.capped) == (4, True)
    result = Archiver(settings).run_once(conn, now=later)
    assert (result.keys, result.capped) == (1, False)
    assert unique_keys(conn) == {"live": live}
    # A deleted key makes a new job, as a key whose window had passed did; a live
    # one still gives its job.
    again = rota.enqueue(conn, "t", key="old-0", unique_for=60, now=later)
    assert unique_keys(conn) == {"live": live, "old-0": again}
    assert rota.enqueue(conn, "t", key="live", unique_for=7200, now=later) == live
    assert count(conn, "unique_key = 'old-0'") == 2


def test_a_schedules_key_stays_while_a_late_slot_may_still_be_judged_by_it(
    conn: psycopg.Connection[Any],
) -> None:
    # Every 15 minutes, unique for 50 minutes: the 12:00 job holds the key until
    # 12:50. A scheduler that stopped after 12:00 judges slot 12:45 by its slot
    # time when it comes back at 12:55: inside the window, however late the clock.
    spec = ScheduleSpec("s", "t", "*/15 * * * *", unique_for_seconds=3000)
    schedule_id = schedule_store.upsert(conn, spec, now=T0 - timedelta(minutes=10))["id"]
    assert Scheduler().run_once(conn, now=T0 + timedelta(seconds=1)).enqueued == 1
    at = T0 + timedelta(minutes=55)
    assert Archiver(NO_GRACE).run_once(conn, now=at).keys == 0  # 12:45 is still to judge
    late = Scheduler().run_once(conn, now=at)
    assert (late.enqueued, late.skipped) == (0, 1)
    assert count(conn, f"schedule_id = {int(schedule_id)}") == 1
    # Judged: every slot from now on is past the window, and the key may go.
    assert Archiver(NO_GRACE).run_once(conn, now=at).keys == 1
    assert Scheduler().run_once(conn, now=T0 + timedelta(hours=1, seconds=1)).enqueued == 1


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_an_enqueue_of_a_key_being_deleted_waits_and_makes_one_job(
    db_url: str, outcome: str
) -> None:
    """The archiver deletes an expired key in a transaction still open; an enqueue
    of the key meanwhile waits for it, then makes one job with a new window (the
    key deleted, or taken over if the deletion rolled back)."""
    later = T0 + timedelta(hours=2)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        old = rota.enqueue(c, "t", key="k", unique_for=60, now=T0)
    with psycopg.connect(db_url) as archiver, psycopg.connect(db_url) as other:
        assert Archiver(NO_GRACE).run_once(archiver, now=later).keys == 1
        made: list[int] = []
        enqueuer = threading.Thread(
            target=lambda: made.append(rota.enqueue(other, "t", key="k", unique_for=600, now=later))
        )
        enqueuer.start()
        wait_for_lock_wait(db_url)
        getattr(archiver, outcome)()
        enqueuer.join(timeout=30)
        other.commit()
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        assert made[0] != old and unique_keys(c) == {"k": made[0]}
        assert count(c, "unique_key = 'k'") == 2
        inside = rota.enqueue(c, "t", key="k", unique_for=600, now=later + timedelta(minutes=9))
        assert inside == made[0]
        assert Archiver(NO_GRACE).run_once(c, now=later + timedelta(minutes=9)).keys == 0


def test_a_key_taken_over_while_the_archiver_runs_keeps_its_new_window(db_url: str) -> None:
    """An enqueue takes an expired key over in a transaction still open; the
    archiver meanwhile passes over the row (it never waits for an enqueue), and
    the new window holds once the enqueue commits."""
    later = T0 + timedelta(hours=2)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        old = rota.enqueue(c, "t", key="k", unique_for=60, now=T0)
        c.execute("SET statement_timeout = '20s'")  # a wait would fail, not hang
        with psycopg.connect(db_url) as taker:
            new = rota.enqueue(taker, "t", key="k", unique_for=600, now=later)
            assert new != old
            assert Archiver(NO_GRACE).run_once(c, now=later).keys == 0
            taker.commit()
        assert unique_keys(c) == {"k": new}
        assert Archiver(NO_GRACE).run_once(c, now=later + timedelta(minutes=9)).keys == 0
        assert (
            rota.enqueue(c, "t", key="k", unique_for=600, now=later + timedelta(minutes=9)) == new
        )
        assert count(c, "unique_key = 'k'") == 2
