"""Limits per job type, as every worker's claim sees them: concurrency, per-group
concurrency, rates, fairness across groups, and claims that interleave."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
from rota.claim import Attempt, claim, write_and_claim, write_outcomes
from rota.errors import InvalidInput
from rota.jobs import Job, Outcome
from rota.reaper import Reaper
from tests.acceptance.procs import wait_for
from tests.table_reads import rows_read
from tests.worker.helpers import _async_handlers, _noop, _running, row

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def finish(conn: psycopg.Connection[Any], jobs: list[Job], worker: str = "w") -> None:
    write_outcomes(conn, worker, [Attempt.of(j, Outcome.DONE) for j in jobs])


def running(conn: psycopg.Connection[Any], job_type: str) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM rota.job WHERE status = 'running' AND type = %s", (job_type,)
    ).fetchone()
    return int(row["n"])  # type: ignore[index]


def add_ready(conn: psycopg.Connection[Any], job_type: str, groups: int, per_group: int) -> None:
    """`groups` x `per_group` due ready jobs, fast (one INSERT ... SELECT)."""
    conn.execute(
        "INSERT INTO rota.job (type, group_key, run_at)"
        " SELECT %s, 'g' || lpad(g::text, 6, '0'), now() - interval '1 hour' + n * interval '1 ms'"
        " FROM generate_series(1, %s) AS g, generate_series(1, %s) AS n",
        (job_type, groups, per_group),
    )


# -- setting them ---------------------------------------------------------------------


def test_set_list_and_clear(conn: psycopg.Connection[Any]) -> None:
    rota.set_limit(conn, "payment", concurrency=5)
    rota.set_limit(conn, "email", rate=100, per=60)
    rota.set_limit(conn, "export", concurrency=10, group_concurrency=1)
    listed = {lim.type: lim.describe() for lim in rota.list_limits(conn)}
    assert listed == {
        "email": "100 per 60s",
        "export": "concurrency 10, per group 1",
        "payment": "concurrency 5",
    }
    rota.set_limit(conn, "payment", group_concurrency=2)  # replaces, does not merge
    assert [lim.describe() for lim in rota.list_limits(conn) if lim.type == "payment"] == [
        "per group 2"
    ]
    assert rota.clear_limit(conn, "payment") is True
    assert rota.clear_limit(conn, "payment") is False
    assert {lim.type for lim in rota.list_limits(conn)} == {"email", "export"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give a limit"),
        ({"concurrency": 0}, "from 1"),
        ({"concurrency": True}, "whole number"),
        ({"concurrency": 2.5}, "whole number"),
        ({"group_concurrency": -1}, "from 1"),
        ({"rate": 10}, "together"),
        ({"per": 10}, "together"),
        ({"rate": 10, "per": 0}, "more than 0"),
        ({"rate": 10, "per": float("inf")}, "number"),
        ({"rate": 10_001, "per": 1}, "from 1 to 10000"),
    ],
)
def test_bad_limits_are_refused_and_nothing_is_written(
    conn: psycopg.Connection[Any], kwargs: dict[str, Any], message: str
) -> None:
    rota.set_limit(conn, "t", concurrency=3)
    with pytest.raises(InvalidInput, match=message):
        rota.set_limit(conn, "t", **kwargs)
    assert [lim.describe() for lim in rota.list_limits(conn)] == ["concurrency 3"]


@pytest.mark.parametrize("job_type", ["", " ", "*", None, "a\x00"])
def test_a_limit_needs_a_job_type(conn: psycopg.Connection[Any], job_type: Any) -> None:
    with pytest.raises(InvalidInput):
        rota.set_limit(conn, job_type, concurrency=1)
    assert rota.list_limits(conn) == []


# -- what the claim does with them -------------------------------------------------------


def test_concurrency_binds_claims_and_a_finished_job_frees_its_slot(
    conn: psycopg.Connection[Any],
) -> None:
    rota.enqueue_many(conn, [rota.NewJob("payment", {"n": n}) for n in range(10)])
    rota.set_limit(conn, "payment", concurrency=3)
    first = claim(conn, "w1", 10, 30)
    assert len(first) == 3
    assert claim(conn, "w2", 10, 30) == []
    [state] = rota.list_limits(conn)
    assert (state.running, state.due, state.held, state.limited) == (3, 7, 7, True)
    # Held-back jobs stay ready, their attempts untouched.
    held = conn.execute("SELECT status, attempts FROM rota.job WHERE status <> 'running'")
    assert {(r["status"], r["attempts"]) for r in held} == {("ready", 0)}
    finish(conn, first[:1], "w1")
    statuses, more = write_and_claim(
        conn, "w1", [Attempt.of(j, Outcome.DONE) for j in first[1:]], 10, 30
    )
    assert len(statuses) == 2
    assert len(more) == 3  # the outcomes written in the claim's transaction free their slots
    assert running(conn, "payment") == 3


def test_unlimited_types_are_claimed_beside_limited_ones(conn: psycopg.Connection[Any]) -> None:
    rota.enqueue_many(conn, [rota.NewJob("payment") for _ in range(5)])
    rota.enqueue_many(conn, [rota.NewJob("other") for _ in range(5)])
    rota.set_limit(conn, "payment", concurrency=2)
    jobs = claim(conn, "w", 10, 30)
    assert sorted(j.type for j in jobs) == ["other"] * 5 + ["payment"] * 2
    assert claim(conn, "w", 10, 30, types=["payment"]) == []
    rota.clear_limit(conn, "payment")
    assert len(claim(conn, "w", 10, 30, types=["payment"])) == 3


def test_a_claim_never_takes_more_than_it_asked_for(conn: psycopg.Connection[Any]) -> None:
    rota.enqueue_many(conn, [rota.NewJob(t) for t in ["a", "b"] * 10])
    rota.set_limit(conn, "a", concurrency=100)
    assert len(claim(conn, "w", 7, 30)) == 7
    assert len(claim(conn, "w", 1, 30)) == 1


def test_a_paused_limited_type_is_not_claimed(conn: psycopg.Connection[Any]) -> None:
    rota.enqueue(conn, "payment")
    rota.set_limit(conn, "payment", concurrency=2)
    rota.pause(conn, ["payment"])
    assert claim(conn, "w", 10, 30) == []
    rota.resume(conn, ["payment"])
    rota.pause(conn, None)
    assert claim(conn, "w", 10, 30) == []
    rota.resume(conn, None)
    assert len(claim(conn, "w", 10, 30)) == 1


def test_rate_counts_starts_in_any_window(conn: psycopg.Connection[Any]) -> None:
    rota.enqueue_many(conn, [rota.NewJob("email") for _ in range(20)], now=T0)
    rota.set_limit(conn, "email", rate=5, per=60)
    got = len(claim(conn, "w", 3, 30, now=T0))
    got += len(claim(conn, "w", 10, 30, now=T0 + timedelta(seconds=30)))
    assert got == 5
    # Finishing does not give a start back: only time does.
    assert claim(conn, "w", 10, 30, now=T0 + timedelta(seconds=59)) == []
    [state] = rota.list_limits(conn, now=T0 + timedelta(seconds=59))
    assert (state.recent_starts, state.held) == (5, 15)
    # The three of T0 leave the window first, the two of T0+30 s later.
    assert len(claim(conn, "w", 10, 30, now=T0 + timedelta(seconds=61))) == 3
    assert len(claim(conn, "w", 10, 30, now=T0 + timedelta(seconds=91))) == 2


def test_group_concurrency_binds_each_group(conn: psycopg.Connection[Any]) -> None:
    for group in ("a", "b", "c"):
        rota.enqueue_many(conn, [rota.NewJob("export", group=group) for _ in range(3)])
    rota.enqueue_many(conn, [rota.NewJob("export") for _ in range(3)])  # no group: one group
    rota.set_limit(conn, "export", group_concurrency=2)
    jobs = claim(conn, "w", 100, 30)
    by_group: dict[str | None, int] = {}
    for job in jobs:
        by_group[job.group_key] = by_group.get(job.group_key, 0) + 1
    assert by_group == {"a": 2, "b": 2, "c": 2, None: 2}
    assert claim(conn, "w", 100, 30) == []
    finish(conn, [j for j in jobs if j.group_key == "b"][:1])
    [job] = claim(conn, "w", 100, 30)
    assert job.group_key == "b"


def test_concurrency_and_group_concurrency_together(conn: psycopg.Connection[Any]) -> None:
    add_ready(conn, "export", groups=10, per_group=5)
    rota.set_limit(conn, "export", concurrency=4, group_concurrency=1)
    jobs = claim(conn, "w", 100, 30)
    assert len(jobs) == 4 and len({j.group_key for j in jobs}) == 4
    assert claim(conn, "w", 100, 30) == []


def test_a_group_with_one_job_waits_one_claim_at_most_behind_a_huge_group(
    conn: psycopg.Connection[Any],
) -> None:
    """100,000 ready jobs of one customer, then one of another: with a group
    limit, the other customer's job is claimed by the first or second claim."""
    add_ready(conn, "export", groups=1, per_group=100_000)
    small = rota.enqueue(conn, "export", group="small")
    conn.execute("ANALYZE rota.job")
    rota.set_limit(conn, "export", group_concurrency=5)
    first = claim(conn, "w", 1, 30)
    second = claim(conn, "w", 1, 30)
    assert small in {j.id for j in first + second}
    # And the big group goes on being served, one claim in turn.
    assert len(claim(conn, "w", 1, 30)) == 1


def test_groups_are_served_in_turn_across_claims(conn: psycopg.Connection[Any]) -> None:
    add_ready(conn, "export", groups=5, per_group=10)
    rota.set_limit(conn, "export", group_concurrency=10)
    seen = []
    for _ in range(10):
        [job] = claim(conn, "w", 1, 30)
        seen.append(job.group_key)
    assert seen == [f"g{n:06d}" for n in range(1, 6)] * 2


# -- claims that interleave ---------------------------------------------------------------


ONE_ROW = {"concurrency": 3, "rate": 10_000, "per": 1.0}
"""A concurrency of 3 with a rate that never binds: claims take the path of one row."""


def test_a_claim_waiting_for_another_counts_what_that_one_claimed(db_url: str) -> None:
    """Two connections claim one limited type: the second blocks on the limit's
    row while the first's transaction is open, and once that commits it sees
    the jobs the first claimed (its statement began before they were running)."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        rota.enqueue_many(setup, [rota.NewJob("payment") for _ in range(10)])
        rota.set_limit(setup, "payment", **ONE_ROW)
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        assert len(claim(first, "w1", 2, 30)) == 2  # first's transaction stays open
        result: list[list[Job]] = []
        waiter = threading.Thread(target=lambda: result.append(claim(second, "w2", 10, 30)))
        waiter.start()
        wait_for_lock_wait(db_url)
        assert waiter.is_alive()
        first.commit()
        waiter.join(timeout=30)
        second.commit()
        assert len(result[0]) == 1  # 3 - 2: not 3


def test_a_rolled_back_claim_leaves_its_slots_free(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        rota.enqueue_many(setup, [rota.NewJob("payment") for _ in range(10)])
        rota.set_limit(setup, "payment", **ONE_ROW)
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        assert len(claim(first, "w1", 3, 30)) == 3
        result: list[list[Job]] = []
        waiter = threading.Thread(target=lambda: result.append(claim(second, "w2", 10, 30)))
        waiter.start()
        wait_for_lock_wait(db_url)
        first.rollback()
        waiter.join(timeout=30)
        second.commit()
        assert len(result[0]) == 3


def test_claims_of_a_concurrency_alone_run_side_by_side_and_stay_exact(db_url: str) -> None:
    """A concurrency alone is held by slots: a second claim beside an open one
    waits for nothing, and takes only what the first left of the limit."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        rota.enqueue_many(setup, [rota.NewJob("payment") for _ in range(20)])
        rota.set_limit(setup, "payment", concurrency=7)
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        taken = len(claim(first, "w1", 2, 30))  # first's transaction stays open
        assert taken == 2
        beside = claim(second, "w2", 20, 30)  # no thread: it must not wait
        assert 1 <= len(beside) <= 7 - taken
        first.commit()
        second.commit()
    with psycopg.connect(db_url) as third:
        later = claim(third, "w3", 20, 30)
        third.commit()
    assert taken + len(beside) + len(later) == 7  # never one more, and none left out


def test_a_slot_claim_rolled_back_leaves_its_slots_free(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        rota.enqueue_many(setup, [rota.NewJob("payment") for _ in range(10)])
        rota.set_limit(setup, "payment", concurrency=3)
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        assert len(claim(first, "w1", 3, 30)) == 3  # every slot with a share is held
        assert claim(second, "w2", 10, 30) == []  # skipped, not waited for
        second.commit()
        first.rollback()
        assert len(claim(second, "w2", 10, 30)) == 3
        second.commit()


def test_a_lowered_concurrency_counts_every_running_job_until_the_slots_fit(db_url: str) -> None:
    """Lowered below what runs, a limit starts nothing until the running jobs
    are under it, slots or not (the claim takes the path of one row meanwhile)."""
    with psycopg.connect(db_url, autocommit=True) as c:
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(20)])
        rota.set_limit(c, "payment", concurrency=8)
        first = claim(c, "w1", 8, 30)
        assert len(first) == 8
        rota.set_limit(c, "payment", concurrency=2)
        assert claim(c, "w2", 10, 30) == []
        write_outcomes(c, "w1", [Attempt.of(j, Outcome.DONE) for j in first[:7]])
        assert len(claim(c, "w2", 10, 30)) == 1  # 2 - the one still running
        assert claim(c, "w2", 10, 30) == []


def test_jobs_running_before_their_limit_count_against_it(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(20)])
        assert len(claim(c, "w1", 5, 30)) == 5  # no limit yet: no slot
        rota.set_limit(c, "payment", concurrency=6)
        assert len(claim(c, "w2", 10, 30)) == 1


def settled(conn: psycopg.Connection[Any], job_type: str) -> bool:
    row = conn.execute(
        "SELECT slots_settled FROM rota.job_limit WHERE type = %s", (job_type,)
    ).fetchone()
    assert row is not None
    return bool(row["slots_settled"])


def test_a_limit_set_on_an_idle_queue_takes_its_slots_at_once(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.set_limit(c, "payment", concurrency=4)
        assert settled(c, "payment")
        rota.set_limit(c, "payment", concurrency=4, rate=10, per=1.0)
        assert settled(c, "payment")  # counted through its slots, on the path of one row
        rota.set_limit(c, "payment", rate=10, per=1.0)
        assert not settled(c, "payment")  # a rate alone: no slots


def test_a_limit_waits_for_the_claims_that_did_not_see_it_before_it_takes_its_slots(
    db_url: str,
) -> None:
    """A claim in flight when the limit is committed starts jobs without a slot;
    the limit is settled on its slots only once that claim has ended and its
    jobs are counted (the claims meanwhile count every running job)."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(20)])
        with psycopg.connect(db_url) as early:
            unseen = claim(early, "w0", 2, 30)  # no limit in its snapshot
            assert len(unseen) == 2
            rota.set_limit(c, "payment", concurrency=4)
            assert not settled(c, "payment")  # that claim is still in flight
            early.commit()
        assert len(claim(c, "w1", 10, 30)) == 2  # 4 - the two claimed unseen
        assert not settled(c, "payment")  # they run without a slot
        finish(c, unseen, "w0")
        assert len(claim(c, "w1", 10, 30)) == 2  # their room, counted on one row
        assert settled(c, "payment")
        assert claim(c, "w1", 10, 30) == []  # on its slots: still 4 at most
        assert running(c, "payment") == 4


def test_the_path_of_one_row_puts_each_job_in_a_slot_with_room(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(30)])
        before = claim(c, "w1", 2, 30)  # no limit yet: no slot
        rota.set_limit(c, "payment", concurrency=10)  # shares 3, 3, 2, 2
        assert len(claim(c, "w2", 20, 30)) == 8  # on one row: 10 - 2
        slots = c.execute(
            "SELECT limit_slot, count(*) AS n FROM rota.job WHERE status = 'running'"
            " GROUP BY limit_slot ORDER BY limit_slot"
        ).fetchall()
        assert {r["limit_slot"]: r["n"] for r in slots} == {0: 3, 1: 3, 2: 2, None: 2}
        write_outcomes(c, "w1", [Attempt.of(j, Outcome.DONE) for j in before])
        assert len(claim(c, "w3", 20, 30)) == 2  # on slots now: the two freed
        assert claim(c, "w3", 20, 30) == []


def test_a_claim_under_a_limit_with_room_to_spare_counts_no_running_job(db_url: str) -> None:
    """A slot's bound (what ran in it and what its last claim started there)
    stands for its count while the share less the bound leaves room for the
    claim: no read of job_limit_slot_idx, whose every entry costs a visit to
    the table, and every version a long transaction keeps."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        rota.set_limit(setup, "payment", concurrency=1_000)  # shares of 250
        rota.enqueue_many(setup, [rota.NewJob("payment") for _ in range(30)])
    with psycopg.connect(db_url) as conn:  # one backend: its claims start at one slot
        assert len(claim(conn, "w", 10, 30)) == 10  # no bound yet: counted
        conn.commit()
        before = _slot_index_scans(conn)  # (the backend's counts not yet reported)
        assert len(claim(conn, "w", 10, 30)) == 10
        scans = _slot_index_scans(conn) - before
        conn.commit()
        assert scans == 0
        bounds = conn.execute(
            "SELECT running_at_most FROM rota.job_limit_slot"
            " WHERE type = 'payment' AND running_at_most IS NOT NULL"
        ).fetchall()
    assert bounds == [(20,)]


@pytest.mark.parametrize("write", ["update", "insert"])
def test_a_job_made_running_in_a_slot_by_hand_is_counted_by_the_next_claim(
    db_url: str, write: str
) -> None:
    """A slot's bound holds what claims started; a row written running into the
    slot by hand makes the slot forget it, so the next claim counts."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.set_limit(c, "payment", concurrency=40)  # shares of 10
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(30)])
        finish(c, claim(c, "w", 2, 30))  # its slot's bound: 2, with none running
        [slot] = c.execute(
            "SELECT slot FROM rota.job_limit_slot WHERE running_at_most IS NOT NULL"
        ).fetchall()
        if write == "update":
            c.execute(
                "UPDATE rota.job SET status = 'running', limit_slot = %(slot)s,"
                " locked_by = 'hand', locked_until = now() + interval '1 hour', attempts = 1"
                " WHERE id IN (SELECT id FROM rota.job WHERE status = 'ready' LIMIT 9)",
                slot,
            )
        else:
            c.execute(
                "INSERT INTO rota.job (type, status, limit_slot, locked_by, locked_until,"
                " attempts)"
                " SELECT 'payment', 'running', %(slot)s, 'hand', now() + interval '1 hour', 1"
                " FROM generate_series(1, 9)",
                slot,
            )
        # The same session starts at the same slot: with the bound of 2 it would
        # take 8 there, 17 running in a share of 10.
        assert len(claim(c, "w", 8, 30)) == 8
        slots = c.execute(
            "SELECT limit_slot, count(*) AS n FROM rota.job WHERE status = 'running'"
            " GROUP BY limit_slot"
        ).fetchall()
        assert {r["limit_slot"]: r["n"] for r in slots}[slot["slot"]] == 10
        assert all(r["n"] <= 10 for r in slots), slots


def _slot_index_scans(conn: psycopg.Connection[Any]) -> int:
    """Scans of job_limit_slot_idx this backend has made and not yet reported
    (it reports when idle outside a transaction, at most once a second)."""
    found = conn.execute(
        "SELECT pg_stat_get_xact_numscans('rota.job_limit_slot_idx'::regclass)"
    ).fetchone()
    assert found is not None
    return int(found[0])


def test_a_bound_left_by_a_slot_claim_is_forgotten_by_the_path_of_one_row(db_url: str) -> None:
    """The path of one row starts jobs in slots by its own count; a bound left
    before it would let the next claim on slots pass the limit."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(60)])
        rota.set_limit(c, "payment", concurrency=40)  # shares of 10
        assert len(claim(c, "w1", 2, 30)) == 2  # on slots: a bound of 2 left
        rota.set_limit(c, "payment", concurrency=40, rate=1_000, per=60)
        assert len(claim(c, "w2", 60, 30)) == 38  # on one row (a rate): every slot full
        rota.set_limit(c, "payment", concurrency=40)
        assert settled(c, "payment")
        assert claim(c, "w1", 8, 30) == []  # 10 run in the slot, not 2
        slots = c.execute(
            "SELECT limit_slot, count(*) AS n FROM rota.job WHERE status = 'running'"
            " GROUP BY limit_slot ORDER BY limit_slot"
        ).fetchall()
        assert {r["limit_slot"]: r["n"] for r in slots} == {0: 10, 1: 10, 2: 10, 3: 10}


def wait_for_lock_wait(
    db_url: str, seconds: float = 30.0, unless: Callable[[], bool] | None = None
) -> None:
    """Until some session of this database waits for a lock, or `unless()` is true
    (a deadline, not a sleep)."""
    deadline = time.monotonic() + seconds
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        while True:
            row = c.execute(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock') AS waits"
            ).fetchone()
            if (row is not None and row["waits"]) or (unless is not None and unless()):
                return
            assert time.monotonic() < deadline, "no session waited for a lock"
            time.sleep(0.01)


def test_an_outcome_that_frees_a_limited_slot_wakes_idle_workers(db_url: str) -> None:
    with (
        psycopg.connect(db_url, autocommit=True) as c,
        psycopg.connect(db_url, autocommit=True) as listener,
    ):
        rota.enqueue_many(c, [rota.NewJob("payment"), rota.NewJob("other")])
        listener.execute("LISTEN rota_jobs")
        list(listener.notifies(timeout=0.5, stop_after=10))  # the enqueue's
        rota.set_limit(c, "payment", concurrency=1)
        list(listener.notifies(timeout=0.5, stop_after=10))  # the limit's
        jobs = {j.type: j for j in claim(c, "w", 10, 30)}
        write_outcomes(c, "w", [Attempt(jobs["other"].id, 1, Outcome.DONE, claim=1)])
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []  # unlimited: no wake
        write_outcomes(c, "w", [Attempt(jobs["payment"].id, 1, Outcome.DONE, claim=1)])
        assert len(list(listener.notifies(timeout=30, stop_after=1))) == 1


@contextlib.contextmanager
def _ten_limited_jobs_heard(
    db_url: str, concurrency: int
) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """Ten ready jobs of a type limited to `concurrency`, and a second connection
    that listens for the wake of idle workers."""
    with (
        psycopg.connect(db_url, autocommit=True) as c,
        psycopg.connect(db_url, autocommit=True) as listener,
    ):
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(10)])
        rota.set_limit(c, "payment", concurrency=concurrency)
        listener.execute("LISTEN rota_jobs")
        yield c, listener


def test_an_outcome_under_a_limit_that_held_nothing_back_wakes_nobody(db_url: str) -> None:
    """A commit that notifies takes a lock of the whole cluster: outcomes under a
    limit that gave every claim all it asked for send nothing, until a claim is
    held back."""
    with _ten_limited_jobs_heard(db_url, concurrency=4) as (c, listener):  # shares 1, 1, 1, 1
        first = claim(c, "w", 1, 30)  # all it asked for
        finish(c, first)
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        held = claim(c, "w", 10, 30)  # four of ten: held back
        assert len(held) == 4
        finish(c, held[:1])
        assert len(list(listener.notifies(timeout=30, stop_after=1))) == 1


def test_a_claim_served_by_two_slots_was_not_held_back(db_url: str) -> None:
    with _ten_limited_jobs_heard(db_url, concurrency=8) as (c, listener):  # shares 2, 2, 2, 2
        jobs = claim(c, "w", 3, 30)  # a slot's 2 and another's 1: all it asked for
        assert len(jobs) == 3
        finish(c, jobs)
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


@pytest.mark.parametrize("plans", ["auto", "force_generic_plan"])
def test_a_batch_of_limited_outcomes_reads_the_limit_slots_once(db_url: str, plans: str) -> None:
    """Whether the batch frees a slot that held a claim back is asked once per
    batch, not once per job, whatever the plan (a worker's statement is
    prepared): the wake check was an index probe of rota.job_limit_slot for
    every outcome written."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        rota.set_limit(setup, "payment", concurrency=1_000)
        rota.enqueue_many(setup, [rota.NewJob("payment") for _ in range(50)])
    with psycopg.connect(db_url) as conn:  # one transaction: its own statistics
        conn.execute("SELECT set_config('plan_cache_mode', %s, true)", (plans,))
        jobs = claim(conn, "w", 50, 30)
        assert len(jobs) == 50
        before = _slot_reads(conn)
        finish(conn, jobs)
        assert _slot_reads(conn) - before <= 2


def _slot_reads(conn: psycopg.Connection[Any]) -> int:
    found = conn.execute(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables"
        " WHERE relid = 'rota.job_limit_slot'::regclass"
    ).fetchone()
    assert found is not None
    return int(found[0])


def _expire(conn: psycopg.Connection[Any], job_id: int) -> None:
    conn.execute(
        "UPDATE rota.job SET locked_until = now() - interval '1 second' WHERE id = %s", (job_id,)
    )


def test_a_reaped_lease_that_frees_a_limited_slot_wakes_idle_workers(db_url: str) -> None:
    with (
        psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c,
        psycopg.connect(db_url, autocommit=True) as listener,
    ):
        rota.set_limit(c, "payment", concurrency=1)
        rota.enqueue_many(c, [rota.NewJob("payment"), rota.NewJob("other")])
        jobs = {j.type: j for j in claim(c, "gone", 10, 30)}
        listener.execute("LISTEN rota_jobs")
        _expire(c, jobs["other"].id)
        assert Reaper().run_once(c).requeued == [jobs["other"].id]
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []  # unlimited: no wake
        _expire(c, jobs["payment"].id)
        assert Reaper().run_once(c).requeued == [jobs["payment"].id]
        assert len(list(listener.notifies(timeout=30, stop_after=1))) == 1


def test_an_idle_worker_claims_at_once_the_job_a_reaped_lease_let_through(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    # A worker died holding the only slot of a limited type; an idle worker waits
    # for a NOTIFY, its next poll a minute away. The reaper gives the slot back
    # and wakes it: the job the limit held back starts within seconds.
    rota.set_limit(conn, "payment", concurrency=1)
    rota.enqueue_many(conn, [rota.NewJob("payment"), rota.NewJob("payment")])
    [held] = claim(conn, "gone", 1, 30)
    handlers = _async_handlers(payment=_noop, probe=_noop)
    with _running(db_url, handlers, concurrency=2, poll_interval_seconds=60):
        probe = rota.enqueue(conn, "probe")
        wait_for(lambda: row(conn, probe)["status"] == "done", 20, "the worker to be idle")
        _expire(conn, held.id)
        assert Reaper().run_once(conn).requeued == [held.id]
        freed = time.monotonic()
        wait_for(lambda: running(conn, "payment") or _done(conn, "payment"), 10, "a claim")
        assert time.monotonic() - freed < 10  # not the poll, a minute away
    assert row(conn, held.id)["status"] == "ready"  # after its backoff


def _done(conn: psycopg.Connection[Any], job_type: str) -> int:
    found = conn.execute(
        "SELECT count(*) AS n FROM rota.job WHERE status = 'done' AND type = %s", (job_type,)
    ).fetchone()
    return int(found["n"])  # type: ignore[index]


# -- what a limited claim reads ------------------------------------------------------------


ONE_ROW_HIGH = {"concurrency": 1_000, "rate": 10_000, "per": 0.001}
"""A concurrency that does not bind, on the path of one row (a rate that never binds)."""


def _claim_plans(db_url: str, job_type: str, n: int) -> list[str]:
    """The plans of every statement a claim of `n` jobs of `job_type` runs, the
    functions' statements included (auto_explain), the claim rolled back."""
    from rota import claim as claims

    plans: list[str] = []
    with psycopg.connect(db_url) as c:
        try:
            c.execute("LOAD 'auto_explain'")
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("auto_explain needs a superuser's session")
        c.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
        ):
            c.execute("SET " + setting)  # type: ignore[operator]
        c.execute(
            claims._claim_query([job_type]), claims._claim_params("w-read", n, 30.0, None, None)
        ).fetchall()
        c.rollback()
    return plans


@pytest.mark.parametrize("limits", [{"concurrency": 1_000}, ONE_ROW_HIGH])
def test_a_limited_claim_reads_no_more_after_many_jobs_ran(
    db_url: str, limits: dict[str, Any]
) -> None:
    """A limited claim counts the type's running jobs and looks for its ready
    ones through indexes that hold those alone, whatever the statistics say
    (here taken before any job ran, as after a large enqueue): never by a scan
    of the table or a bitmap of every version of the type's rows, which the
    jobs run since the last vacuum make longer for every claim."""
    with psycopg.connect(db_url, autocommit=True) as c:
        add_ready(c, "export", 10, 1_600)
        c.execute("VACUUM ANALYZE rota.job")
        # The statistics stay those: no autovacuum's ANALYZE halfway.
        c.execute("ALTER TABLE rota.job SET (autovacuum_enabled = false)")
        rota.set_limit(c, "export", **limits)
        held = claim(c, "w1", 40, 30)
        for _ in range(150):
            finish(c, claim(c, "w2", 100, 30), "w2")
        assert len(held) == 40
    plans = _claim_plans(db_url, "export", 20)
    assert any("FROM rota.job_limit AS l" in plan for plan in plans), plans  # its statements
    for plan in plans:
        for line in plan.splitlines():
            # (Rows reached by their ids, a bitmap of job_pkey included, are fine.)
            assert not re.search(r"Seq Scan on job\b", line), plan
            assert "job_type_idx" not in line, plan
            assert "Bitmap Index Scan on job_running_idx" not in line, plan


# -- the running jobs a claim counts --------------------------------------------------


@pytest.mark.parametrize(
    "limits", [{"group_concurrency": 2}, {"concurrency": 500, "group_concurrency": 2}]
)
def test_a_group_limited_claim_counts_only_its_types_running_jobs(
    db_url: str, limits: dict[str, int]
) -> None:
    """The path of one row counts the running jobs of its type, through the
    slots every limited claim labels its jobs with, not by a walk of every
    running job of every type (a claim per limited type with due jobs, each
    reading the whole running set: seconds a claim with many limits)."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.enqueue_many(c, [rota.NewJob("other") for _ in range(3_000)])
        assert len(claim(c, "w", 3_000, 300)) == 3_000  # running, another type
        rota.set_limit(c, "export", **limits)
        add_ready(c, "export", groups=20, per_group=3)
        assert len(claim(c, "w", 20, 300, ["export"])) == 20
    with psycopg.connect(db_url) as conn:
        before = rows_read(conn)
        got = claim(conn, "w", 30, 300, ["export"])
        reads = rows_read(conn) - before
        conn.rollback()
    assert len(got) == 20  # one more of each group
    assert reads < 500, reads


@pytest.mark.parametrize(
    "limits",
    [{"concurrency": 4}, {"group_concurrency": 1}, {"concurrency": 4, "rate": 100, "per": 60}],
)
@pytest.mark.parametrize("write", ["update", "insert"])
def test_a_job_made_running_without_a_slot_by_hand_counts_against_its_limit(
    db_url: str, limits: dict[str, int], write: str
) -> None:
    """A row written running with no slot (by an UPDATE or INSERT by hand, not
    a claim) is seen by the next claim of its type, however settled the limit
    was: the write unsettles it, and the claim counts every running job."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.set_limit(c, "payment", **limits)
        add_ready(c, "payment", groups=1, per_group=10)
        if write == "update":
            c.execute(
                "UPDATE rota.job SET status = 'running', locked_by = 'hand',"
                " locked_until = now() + interval '1 hour', attempts = 1"
                " WHERE id IN (SELECT id FROM rota.job WHERE status = 'ready'"
                " ORDER BY id LIMIT 3)"
            )
        else:
            c.execute(
                "INSERT INTO rota.job (type, group_key, status, locked_by, locked_until,"
                " attempts)"
                " SELECT 'payment', 'g000001', 'running', 'hand', now() + interval '1 hour', 1"
                " FROM generate_series(1, 3)"
            )
        expected = 1 if "concurrency" in limits else 0  # 4 - 3; the group holds 1
        assert len(claim(c, "w", 10, 30)) == expected
        assert claim(c, "w", 10, 30) == []


def test_a_job_made_running_by_hand_while_a_limit_waits_to_settle_is_counted(
    db_url: str,
) -> None:
    """The write by hand happens while the limit waits for a claim that did not
    see it (its fence): the claim that settles the limit after that one has
    ended must not settle it past the uncommitted row, nor leave it settled
    once the row is committed."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        rota.enqueue_many(c, [rota.NewJob("payment") for _ in range(10)])
        with psycopg.connect(db_url) as early, psycopg.connect(db_url) as hand:
            assert claim(early, "w0", 1, 30, ["other"]) == []  # in flight, no limit seen
            rota.set_limit(c, "payment", concurrency=4)
            assert not settled(c, "payment")  # fenced by that claim
            hand.execute(
                "UPDATE rota.job SET status = 'running', locked_by = 'hand',"
                " locked_until = now() + interval '1 hour', attempts = 1"
                " WHERE id = (SELECT min(id) FROM rota.job WHERE type = 'payment')"
            )
            early.commit()
            taken: list[list[Job]] = []
            claimer = threading.Thread(target=lambda: taken.append(claim(c, "w1", 10, 30)))
            claimer.start()
            wait_for_lock_wait(db_url, unless=lambda: not claimer.is_alive())
            hand.commit()
            claimer.join(timeout=60)
        assert running(c, "payment") <= 4
        assert claim(c, "w1", 10, 30) == []
        assert running(c, "payment") == 4
