"""Job control in SQL: cancel, pause and resume, retry of ended jobs, priorities, and
the claim staying one walk of its index with a million ready jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import rota
from rota import claim as claims
from rota import control, sql
from rota.claim import Attempt
from rota.errors import InvalidInput
from rota.jobs import Outcome, Status
from rota.reaper import Reaper
from rota.status import queue_age, read_status

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def status_of(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT status FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row["status"])


def test_cancel_ends_ready_jobs_and_asks_running_ones(conn) -> None:
    ready, running, done = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)], now=T0)
    conn.execute("UPDATE rota.job SET status = 'done' WHERE id = %s", (done,))
    conn.execute("UPDATE rota.job SET run_at = %s WHERE id = %s", (at(100), ready))
    [claimed] = claims.claim(conn, "w", 1, 30, now=at(1))
    assert claimed.id == running
    result = control.cancel(conn, [ready, running, done], now=at(2))
    assert (result.ended, result.requested) == ([ready], [running])
    assert [status_of(conn, i) for i in (ready, running, done)] == ["cancelled", "running", "done"]
    # The worker learns of it from its heartbeat, and a retry it writes ends cancelled.
    [lease] = claims.extend_leases(conn, "w", [(running, 1)], 30, now=at(3))
    assert lease.cancel_requested
    written = claims.write_outcomes(
        conn, "w", [Attempt(running, 1, Outcome.RETRY, 5, claim=1)], now=at(4)
    )
    assert written == {(running, 1): Status.CANCELLED}


def test_cancel_of_an_unknown_id_writes_nothing(conn) -> None:
    job_id = rota.enqueue(conn, "t")
    with pytest.raises(InvalidInput, match="no job with id 424242"):
        control.cancel(conn, [job_id, 424242])
    assert status_of(conn, job_id) == "ready"


def test_a_cancelled_job_whose_worker_died_ends_cancelled(conn) -> None:
    job_id = rota.enqueue(conn, "t", now=T0)
    claims.claim(conn, "w", 1, 30, now=at(0))
    control.cancel(conn, [job_id], now=at(1))
    result = Reaper().run_once(conn, now=at(31))
    assert result.cancelled == [job_id] and result.count == 1
    assert status_of(conn, job_id) == "cancelled"


def test_a_handler_that_finishes_first_keeps_its_outcome(conn) -> None:
    job_id = rota.enqueue(conn, "t", now=T0)
    claims.claim(conn, "w", 1, 30, now=at(0))
    control.cancel(conn, [job_id], now=at(1))
    claims.write_outcomes(conn, "w", [Attempt(job_id, 1, Outcome.DONE, claim=1)], now=at(2))
    assert status_of(conn, job_id) == "done"


def test_cancel_by_type_and_status(conn) -> None:
    a, b, c = rota.enqueue_many(conn, [rota.NewJob(t) for t in ("x", "x", "y")], now=T0)
    claims.claim(conn, "w", 1, 30, types=["x"], now=at(0))
    result = control.cancel_matching(conn, "x", Status.READY, now=at(1))
    assert (result.ended, result.requested) == ([b], [])
    assert [status_of(conn, i) for i in (a, b, c)] == ["running", "cancelled", "ready"]


def test_paused_types_are_not_claimed_until_resumed(conn) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob(t) for t in ("a", "b", "a")], now=T0)
    assert control.pause(conn, ["a"]) == ["a"]
    assert [j.id for j in claims.claim(conn, "w", 10, 30, now=at(1))] == [ids[1]]
    assert queue_age(conn, now=at(1)).ready_jobs == 0  # the paused jobs are not waiting
    assert queue_age(conn, ["a"], now=at(1)).paused_types == ("a",)
    status = read_status(conn, now=at(1))
    assert status.types["a"].paused and not status.types["b"].paused
    assert control.resume(conn, ["a"]) == ["a"]
    assert sorted(j.id for j in claims.claim(conn, "w", 10, 30, now=at(2))) == [ids[0], ids[2]]


def test_pausing_everything_stops_every_claim(conn) -> None:
    rota.enqueue(conn, "a", now=T0)
    control.pause(conn, None)
    assert claims.claim(conn, "w", 10, 30, now=at(1)) == []
    control.resume(conn, ["a"])  # every type is still paused
    assert claims.claim(conn, "w", 10, 30, now=at(1)) == []
    control.resume(conn, None)
    assert len(claims.claim(conn, "w", 10, 30, now=at(1))) == 1


@pytest.mark.parametrize("bad", [[""], ["*"], []])
def test_pause_refuses_what_is_no_type(conn, bad) -> None:
    with pytest.raises(InvalidInput):
        control.pause(conn, bad)
    assert control.paused(conn) == []


def test_retry_brings_back_failed_and_cancelled_jobs(conn) -> None:
    a, b = rota.enqueue_many(conn, [rota.NewJob("t"), rota.NewJob("t")], now=T0)
    control.cancel(conn, [a], now=at(1))
    conn.execute("UPDATE rota.job SET status = 'failed', finished_at = now() WHERE id = %s", (b,))
    revived = control.retry(conn, [a, b], statuses=[Status.CANCELLED, Status.FAILED], now=at(2))
    assert revived == [a, b]
    assert [status_of(conn, i) for i in (a, b)] == ["ready", "ready"]
    with pytest.raises(InvalidInput):
        control.retry(conn, [a], statuses=[Status.RUNNING])


def test_the_claim_takes_the_most_urgent_due_jobs_first(conn) -> None:
    late_urgent = rota.enqueue(conn, "t", priority=0, run_at=at(5), now=T0)
    old_low = rota.enqueue(conn, "t", priority=5, run_at=at(-60), now=T0)
    urgent = rota.enqueue(conn, "t", priority=0, run_at=at(1), now=T0)
    future_urgent = rota.enqueue(conn, "t", priority=0, run_at=at(3600), now=T0)
    claimed = claims.claim(conn, "w", 3, 30, now=at(10))
    assert [j.id for j in claimed] == [urgent, late_urgent, old_low]
    assert future_urgent not in [j.id for j in claimed]


def test_priority_and_timeout_defaults_come_from_the_handler(conn) -> None:
    @rota.handler("urgent.kind", priority=1, timeout=7)
    def urgent_kind(job: rota.Job) -> None: ...

    job_id = rota.enqueue(conn, "urgent.kind")
    row = conn.execute(
        "SELECT priority, timeout_seconds FROM rota.job WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == {"priority": 1, "timeout_seconds": None}  # the timeout applies at run time
    with pytest.raises(InvalidInput):
        rota.handler("bad.kind", priority=10)


@pytest.mark.slow
def test_the_claim_is_one_index_walk_over_a_million_ready_jobs(conn) -> None:
    conn.execute(
        "INSERT INTO rota.job (type, priority, run_at)"
        " SELECT 'job' || (g % 7), g % 10, now() - (g || ' seconds')::interval"
        " FROM generate_series(1, 1000000) AS g"
    )
    conn.execute(
        "INSERT INTO rota.job (type, priority, run_at)"
        " SELECT 'job1', g % 10, now() + interval '1 day' FROM generate_series(1, 200000) AS g"
    )
    conn.execute("ANALYZE rota.job")
    params = claims._claim_params("w", 100, 30, None, None)
    for types in (None, ["job1", "job2"]):
        text = sql.query("claim_jobs")
        with conn.transaction():
            plan = conn.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {text}", {**params, "types": types}
            ).fetchone()
            nodes = list(_nodes(plan["QUERY PLAN"][0]["Plan"]))
            kinds = {(n["Node Type"], n.get("Relation Name")) for n in nodes}
            assert ("Seq Scan", "job") not in kinds, kinds
            assert not any(kind == "Sort" for kind, _ in kinds), kinds
            scans = [
                n for n in nodes if n.get("Relation Name") == "job" and "Index" in n["Node Type"]
            ]
            assert {n["Index Name"] for n in scans} <= {"job_claim_idx", "job_pkey"}, scans
            walked = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in scans)
            assert walked < 5000, walked  # never the million, nor the future jobs
            raise psycopg.Rollback()  # EXPLAIN ANALYZE ran the claim: undo it


def _nodes(plan: dict[str, Any]) -> Any:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_cancel_by_type_and_retry_all_work_in_capped_batches(
    conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "BATCH_SIZE", 3)
    statements: list[str] = []
    real = control.fetch_all

    def counted(c: Any, text: str, params: Any = None) -> Any:
        statements.append(text)
        return real(c, text, params)

    monkeypatch.setattr(control, "fetch_all", counted)
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(8)], now=T0)
    other = rota.enqueue(conn, "u", now=T0)
    running = [j.id for j in claims.claim(conn, "w", 4, 30, ["t"], now=at(1))]
    result = control.cancel_matching(conn, "t", now=at(2))
    assert result.ended == sorted(set(ids) - set(running))
    assert result.requested == sorted(running)
    assert status_of(conn, other) == "ready"
    # The 8 jobs read at once, then cancelled by id in batches of 3, 3 and 2.
    assert len(statements) == 4
    conn.execute("UPDATE rota.job SET status = 'dead', finished_at = now() WHERE type = 't'")
    statements.clear()
    assert control.retry(conn, all_matching=True, now=at(3)) == sorted(ids)
    assert len(statements) == 3  # 3 + 3 + 2
    assert {status_of(conn, i) for i in ids} == {"ready"}
