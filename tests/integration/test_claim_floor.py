"""Where a worker's claims start (rota.floor.Floor), and what a held snapshot costs.

A transaction held open elsewhere keeps the ready version of every job claimed
since it began, and their entries in the claim index with them: a claim that
walks from the first entry visits each. A claim that starts where its worker's
last one ended does not; a job that became ready behind that point is found by
the floor's probe.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import tuple_row

import rota
from rota import claim as claims
from rota import sql
from rota.floor import Floor

WORKER = "floor-worker"


def _entries_walked(
    conn: psycopg.Connection[Any],
    since: list[Any] | None,
    limited: dict[str, Any] | None = None,
    indexes: tuple[str, ...] = ("job_claim_idx",),
) -> tuple[int, int]:
    """(entries of `indexes` a claim of 10 read, jobs it claimed), run and rolled back.

    Every entry the scan reads counts, whether or not its row version is one the
    claim can see (pg_stat_get_xact_tuples_returned of each index)."""
    params = claims._claim_params(WORKER, 10, 30.0, None, since, limited)
    read = "SELECT " + " + ".join(
        f"pg_stat_get_xact_tuples_returned('rota.{index}'::regclass)" for index in indexes
    )
    with conn.transaction(force_rollback=True), conn.cursor(row_factory=tuple_row) as cur:
        before = cur.execute(read).fetchone()
        claimed = cur.execute(claims._claim_query(["t"]), params).fetchall()
        after = cur.execute(read).fetchone()
    assert before is not None and after is not None
    return after[0] - before[0], len(claimed)


def _claimed_beside_a_held_snapshot(
    c: psycopg.Connection[Any], held: psycopg.Connection[Any]
) -> Floor:
    """2,900 of 3,000 jobs of type "t" claimed and done, 100 at a time from a
    worker's floor, while `held` keeps a snapshot taken before; the floor."""
    start = c.execute("SELECT now() - interval '1 hour'").fetchone()
    assert start is not None
    # One job a millisecond: the margin behind the last claimed covers 100.
    rota.enqueue_many(
        c, [rota.NewJob("t", run_at=start[0] + timedelta(milliseconds=i)) for i in range(3_000)]
    )
    held.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    held.execute("SELECT count(*) FROM rota.job").fetchone()  # the snapshot is taken
    floor = Floor(["t"])
    floor.probe(c)  # learns whether "t" is limited
    for _ in range(29):
        since, limited, generation = floor.bounds()
        jobs = claims.claim(c, WORKER, 100, 30.0, ["t"], since=since, limited_since=limited)
        assert len(jobs) == 100
        floor.claimed(jobs, generation)
        claims.write_outcomes(c, WORKER, [claims.Attempt.of(j, rota.Outcome.DONE) for j in jobs])
    return floor


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_a_claim_from_its_floor_walks_past_the_jobs_a_held_snapshot_keeps(
    db_url: str,
) -> None:
    with (
        psycopg.connect(db_url, autocommit=True) as c,
        psycopg.connect(db_url) as held,
    ):
        floor = _claimed_beside_a_held_snapshot(c, held)
        from_first, claimed = _entries_walked(c, None)
        assert claimed == 10
        since, _, _ = floor.bounds()
        from_floor, claimed = _entries_walked(c, since)
        assert claimed == 10
        # From the first entry the claim reads one for each of the 2,900 kept
        # versions; from the floor, only those of the last claim's margin.
        assert from_first >= 2_900, from_first
        assert from_floor <= 200, (from_floor, from_first)
        held.rollback()


@pytest.fixture
def floor_after_claims(conn: psycopg.Connection[Any]) -> Floor:
    """A floor whose priority 0 starts at the last of 3 jobs claimed."""
    rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)])
    floor = Floor(["t"])
    since, _, generation = floor.bounds()
    jobs = claims.claim(conn, WORKER, 10, 30.0, ["t"], since=since)
    assert len(jobs) == 3
    floor.claimed(jobs, generation)
    return floor


def _start(floor: Floor, priority: int = 0) -> Any:
    return floor.bounds()[0][priority]


def test_a_claim_moves_its_priority_start_up_to_its_last_job_less_the_margin(
    conn: psycopg.Connection[Any], floor_after_claims: Floor
) -> None:
    last = conn.execute("SELECT max(run_at) AS t FROM rota.job").fetchone()["t"]
    assert _start(floor_after_claims) == last - Floor.MARGIN
    assert all(start is None for start in floor_after_claims.bounds()[0][1:])
    assert floor_after_claims.probe(conn) == []  # nothing ready behind it


def test_a_job_ready_behind_the_start_is_found_by_the_probe_and_claimed(
    conn: psycopg.Connection[Any], floor_after_claims: Floor
) -> None:
    behind = rota.enqueue(conn, "t", run_at=_start(floor_after_claims) - timedelta(hours=1))
    since, _, _ = floor_after_claims.bounds()
    assert claims.claim(conn, WORKER, 10, 30.0, ["t"], since=since) == []
    assert floor_after_claims.probe(conn) == [0]
    since, _, generation = floor_after_claims.bounds()
    jobs = claims.claim(conn, WORKER, 10, 30.0, ["t"], since=since)
    assert [j.id for j in jobs] == [behind]
    floor_after_claims.claimed(jobs, generation)
    assert floor_after_claims.probe(conn) == []


def test_a_claim_sent_before_the_probe_moved_the_start_back_does_not_undo_it(
    conn: psycopg.Connection[Any], floor_after_claims: Floor
) -> None:
    # A claim in flight on one lane while the heartbeat thread probes: its
    # answer must not move the start past the job the probe found.
    _, _, before = floor_after_claims.bounds()
    behind = rota.enqueue(conn, "t", run_at=_start(floor_after_claims) - timedelta(hours=1))
    rota.enqueue(conn, "t")
    assert floor_after_claims.probe(conn) == [0]
    lowered = _start(floor_after_claims)
    in_flight = claims.claim(conn, WORKER, 1, 30.0, ["t"], since=[lowered + timedelta(hours=1)])
    floor_after_claims.claimed(in_flight, before)
    assert _start(floor_after_claims) == lowered
    since, _, _ = floor_after_claims.bounds()
    assert [j.id for j in claims.claim(conn, WORKER, 10, 30.0, ["t"], since=since)] == [behind]


def test_the_probe_skips_paused_types_and_a_resumed_type_is_found(
    conn: psycopg.Connection[Any], floor_after_claims: Floor
) -> None:
    old = _start(floor_after_claims) - timedelta(minutes=5)
    behind = rota.enqueue(conn, "t", run_at=old)
    rota.pause(conn, ["t"])
    assert floor_after_claims.probe(conn) == []  # a paused type moves nothing
    rota.resume(conn, ["t"])
    assert floor_after_claims.probe(conn) == [0]
    since, _, _ = floor_after_claims.bounds()
    assert [j.id for j in claims.claim(conn, WORKER, 10, 30.0, ["t"], since=since)] == [behind]


def test_jobs_of_limited_types_move_no_start(conn: psycopg.Connection[Any]) -> None:
    # Limited types are claimed apart from the walk: a late limited job must not
    # move the walk's start past an earlier unlimited one it did not reach.
    rota.set_limit(conn, "lim", concurrency=10)
    floor = Floor(None)
    floor.claimed([], 0)
    rota.enqueue(conn, "t")  # makes the probe run: something to move
    since, _, generation = floor.bounds()
    floor.claimed(claims.claim(conn, WORKER, 1, 30.0, since=since), generation)
    floor.probe(conn)  # learns which types are limited
    start = _start(floor)
    rota.enqueue(conn, "lim", run_at=start + timedelta(hours=1), now=start + timedelta(hours=2))
    since, _, generation = floor.bounds()
    jobs = claims.claim(conn, WORKER, 10, 30.0, since=since, now=start + timedelta(hours=2))
    assert [j.type for j in jobs] == ["lim"]
    floor.claimed(jobs, generation)
    assert _start(floor) == start


def test_the_claim_walks_from_its_start_in_the_index(conn: psycopg.Connection[Any]) -> None:
    # The start is a bound of the index scan, not a filter after it.
    text = sql.query("claim_jobs")
    assert "(run_at, id) >= (coalesce((%(since)s::timestamptz[])[p.priority + 1]" in text
    rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)])
    since = [None] * 10
    since[0] = conn.execute("SELECT max(run_at) AS t FROM rota.job").fetchone()["t"]
    params = claims._claim_params(WORKER, 10, 30.0, None, since)
    with conn.transaction(force_rollback=True), conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("EXPLAIN (FORMAT JSON) " + claims._claim_query(["t"]), params).fetchone()
    assert row is not None
    plan = (json.loads(row[0]) if isinstance(row[0], str) else row[0])[0]["Plan"]
    walks = [n for n in _nodes(plan) if n.get("Index Name") == "job_claim_idx"]
    assert walks and all("ROW(run_at, id) >=" in n.get("Index Cond", "") for n in walks), (
        json.dumps(plan)
    )


def test_a_limited_claim_from_its_floor_walks_past_the_jobs_a_held_snapshot_keeps(
    db_url: str,
) -> None:
    # A limited type's jobs are picked from job_group_ready_idx, its jobs
    # without a group one range per priority: the floor starts that range too.
    with (
        psycopg.connect(db_url, autocommit=True) as c,
        psycopg.connect(db_url) as held,
    ):
        rota.set_limit(c, "t", concurrency=1_000_000)
        floor = _claimed_beside_a_held_snapshot(c, held)
        # The picks may walk job_group_ready_idx or job_claim_idx, as planned. (A
        # count of the jobs running in a slot reads every version the snapshot
        # keeps in job_limit_slot_idx, but a limit with room to spare is not
        # counted: its slot's bound stands in, migration 0033.)
        ready = ("job_group_ready_idx", "job_claim_idx")
        from_first, claimed = _entries_walked(c, None, None, ready)
        assert claimed == 10
        since, limited, _ = floor.bounds()
        assert limited["t"][0] is not None
        from_floor, claimed = _entries_walked(c, since, limited, ready)
        assert claimed == 10
        assert from_first >= 2_900, from_first
        assert from_floor <= 400, (from_floor, from_first)
        held.rollback()


@pytest.fixture
def limited_floor(conn: psycopg.Connection[Any]) -> tuple[Floor, list[int], list[Any]]:
    """A floor over limited type "lim" (concurrency 2) after one claim took the first
    two of five jobs an hour apart; the five ids in run_at order, the two jobs."""
    rota.set_limit(conn, "lim", concurrency=2)
    base = conn.execute("SELECT now() - interval '10 hours' AS t").fetchone()["t"]
    ids = [rota.enqueue(conn, "lim", run_at=base + timedelta(hours=i)) for i in range(5)]
    floor = Floor(["lim"])
    floor.probe(conn)  # learns that "lim" is limited
    since, limited, generation = floor.bounds()
    jobs = claims.claim(conn, WORKER, 10, 30.0, ["lim"], since=since, limited_since=limited)
    assert [j.id for j in jobs] == ids[:2]
    floor.claimed(jobs, generation)
    return floor, ids, jobs


def _finish(conn: psycopg.Connection[Any], jobs: list[Any]) -> None:
    claims.write_outcomes(conn, WORKER, [claims.Attempt.of(j, rota.Outcome.DONE) for j in jobs])


def _limited_claim(conn: psycopg.Connection[Any], floor: Floor) -> list[Any]:
    since, limited, generation = floor.bounds()
    jobs = claims.claim(conn, WORKER, 10, 30.0, ["lim"], since=since, limited_since=limited)
    floor.claimed(jobs, generation)
    return jobs


def test_a_limited_claim_moves_its_types_start_and_not_the_walks(
    conn: psycopg.Connection[Any], limited_floor: tuple[Floor, list[int], list[Any]]
) -> None:
    floor, ids, _ = limited_floor
    second = conn.execute("SELECT run_at FROM rota.job WHERE id = %s", (ids[1],)).fetchone()
    since, limited, _ = floor.bounds()
    assert limited == {"lim": [second["run_at"] - Floor.MARGIN] + [None] * 9}
    assert since == [None] * 10
    assert floor.probe(conn) == []  # nothing ready behind it


def test_jobs_a_limit_held_back_are_never_behind_the_start(
    conn: psycopg.Connection[Any], limited_floor: tuple[Floor, list[int], list[Any]]
) -> None:
    floor, ids, first = limited_floor
    assert _limited_claim(conn, floor) == []  # the limit is full
    _finish(conn, first)
    # No probe in between: the next two are found from the start.
    assert [j.id for j in _limited_claim(conn, floor)] == ids[2:4]


def test_a_limited_job_ready_behind_the_start_is_found_by_the_probe(
    conn: psycopg.Connection[Any], limited_floor: tuple[Floor, list[int], list[Any]]
) -> None:
    floor, ids, first = limited_floor
    _finish(conn, first)
    _, before, _ = floor.bounds()
    behind = rota.enqueue(conn, "lim", run_at=before["lim"][0] - timedelta(hours=5))
    since, limited, generation = floor.bounds()
    # A claim sent before the probe moved the start back does not undo it.
    in_flight = claims.claim(conn, WORKER, 1, 30.0, ["lim"], since=since, limited_since=limited)
    assert [j.id for j in in_flight] == [ids[2]]
    assert floor.probe(conn) == [0]
    floor.claimed(in_flight, generation)
    assert floor.bounds()[1]["lim"][0] < before["lim"][0]
    assert [j.id for j in _limited_claim(conn, floor)] == [behind]


def test_a_type_whose_limit_is_cleared_loses_its_starts(
    conn: psycopg.Connection[Any], limited_floor: tuple[Floor, list[int], list[Any]]
) -> None:
    floor, _, _ = limited_floor
    rota.clear_limit(conn, "lim")
    floor.probe(conn)
    assert floor.bounds()[1] == {}


def test_jobs_of_named_groups_move_no_start(conn: psycopg.Connection[Any]) -> None:
    rota.set_limit(conn, "lim", concurrency=10)
    floor = Floor(["lim"])
    floor.probe(conn)
    rota.enqueue(conn, "lim", group="g")
    assert len(_limited_claim(conn, floor)) == 1
    assert floor.bounds()[1] == {}


def test_the_three_argument_pick_of_0_3_still_picks(conn: psycopg.Connection[Any]) -> None:
    # A worker of 0.3 still running beside a migrated database calls it so.
    rota.set_limit(conn, "lim", concurrency=2)
    ids = [rota.enqueue(conn, "lim") for _ in range(3)]
    with conn.transaction(force_rollback=True):
        rows = conn.execute(
            "SELECT id, limit_slot FROM rota.pick_limited(now(), ARRAY['lim'], 10)"
        ).fetchall()
    assert sorted(r["id"] for r in rows) == ids[:2]
    assert all(r["limit_slot"] is not None for r in rows)
