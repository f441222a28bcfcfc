"""Claiming, leases, outcomes and the reaper, with the clock injected."""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
from rota import claim as claims
from rota.claim import Attempt
from rota.control import retry_dead
from rota.errors import InvalidInput
from rota.jobs import Outcome
from rota.lookup import get_job
from rota.reaper import Reaper, ReaperSettings
from rota.settings import BackoffSettings
from rota.status import queue_age
from tests.acceptance.procs import wait_for

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    return conn.execute("SELECT * FROM rota.job WHERE id = %s", (job_id,)).fetchone()  # type: ignore[return-value]


def test_claim_marks_running_with_a_lease_and_counts_the_attempt(
    conn: psycopg.Connection[Any],
) -> None:
    job_id = rota.enqueue(conn, "t", now=T0)
    [job] = claims.claim(conn, "w1", 10, 30, now=at(1))
    assert (job.id, job.attempts, job.locked_by) == (job_id, 1, "w1")
    r = row(conn, job_id)
    assert (r["status"], r["locked_by"], r["locked_until"], r["started_at"]) == (
        "running",
        "w1",
        at(31),
        at(1),
    )


def test_a_claimed_job_reads_as_its_row(conn: psycopg.Connection[Any]) -> None:
    # The claim's rows travel in binary; every field must read as the row does.
    payload = {"order": 7, "note": "naïve ünïcode", "nested": [1.5, None, {"a": True}]}
    job_id = rota.enqueue(
        conn, "t", payload, key="k-1", max_attempts=3, priority=4, timeout=2.5, now=T0
    )
    conn.execute(
        "UPDATE rota.job SET schedule_id = 9, slot = %s, last_error = 'before' WHERE id = %s",
        (at(-60), job_id),
    )
    [claimed] = claims.claim(conn, "w1", 10, 30, now=at(1))
    fields = [f.name for f in dataclasses.fields(claimed) if f.compare]
    read = get_job(conn, job_id)
    assert [getattr(claimed, f) for f in fields] == [getattr(read, f) for f in fields]
    assert (claimed.payload, claimed.slot, claimed.timeout_seconds) == (payload, at(-60), 2.5)


def test_claim_respects_run_at_types_and_limit(conn: psycopg.Connection[Any]) -> None:
    rota.enqueue_many(conn, [rota.NewJob("a") for _ in range(5)], now=T0)
    rota.enqueue(conn, "b", now=T0)
    rota.enqueue(conn, "a", delay=60, now=T0)
    assert claims.claim(conn, "w", 10, 30, types=["zzz"], now=at(1)) == []
    got = claims.claim(conn, "w", 3, 30, types=["a"], now=at(1))
    assert [j.type for j in got] == ["a"] * 3
    rest = claims.claim(conn, "w", 10, 30, now=at(1))
    assert sorted(j.type for j in rest) == ["a", "a", "b"]  # the delayed one waits
    assert [j.type for j in claims.claim(conn, "w", 10, 30, now=at(61))] == ["a"]


@pytest.mark.parametrize("odd", ["it's", "100%", "a,b", "{x}", 'say "hi"', "back\\slash"])
def test_a_type_of_any_spelling_is_claimed_and_only_it(
    conn: psycopg.Connection[Any], odd: str
) -> None:
    # The worker's types are written into its claim statement, not bound.
    rota.enqueue_many(conn, [rota.NewJob(odd), rota.NewJob("plain")], now=T0)
    got = claims.claim(conn, "w", 10, 30, types=[odd], now=at(1))
    assert [j.type for j in got] == [odd]
    _, more = claims.write_and_claim(conn, "w", [], 10, 30, types=[odd, "plain"], now=at(1))
    assert [j.type for j in more] == ["plain"]


def test_concurrent_claimers_never_share_a_job(db_url: str) -> None:
    rota.enqueue_many(db_url, [rota.NewJob("t") for _ in range(2000)])
    claimed: list[list[int]] = [[] for _ in range(6)]

    def claimer(n: int) -> None:
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:  # type: ignore[arg-type]
            while jobs := claims.claim(c, f"w{n}", 25, 30):
                claimed[n].extend(j.id for j in jobs)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for ids in claimed for i in ids]
    assert len(everything) == 2000 == len(set(everything))
    assert sum(1 for ids in claimed if ids) > 1


def test_a_heartbeat_and_an_outcome_batch_of_the_same_rows_never_deadlock(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    # Each statement locks its rows one after the other. A third transaction
    # holds the middle row until both wait for it; given in opposite orders and
    # locked as given, the two would then each hold a row the other needs.
    a, b, c = rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)])
    claims.claim(conn, "w", 3, 30)
    # A table of some size, so that both statements reach their rows by key, in
    # the order of their arrays, as they do in production (on three rows they
    # scan the table and lock in its order).
    conn.execute(
        "INSERT INTO rota.job (type, status, finished_at)"
        " SELECT 'filler', 'done', now() FROM generate_series(1, 20000)"
    )
    conn.execute("ANALYZE rota.job")
    failures: list[BaseException] = []

    def run(call: Any) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as own:  # type: ignore[arg-type]
                call(own)
        except BaseException as exc:
            failures.append(exc)

    def waiting_for_a_lock() -> int:
        return conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()["n"]  # type: ignore[index]

    heartbeat = threading.Thread(
        target=run, args=(lambda own: claims.extend_leases(own, "w", [(a, 1), (b, 1), (c, 1)], 30),)
    )
    batch = [Attempt(job_id, 1, Outcome.DONE, claim=1) for job_id in (c, b, a)]
    outcomes = threading.Thread(
        target=run, args=(lambda own: claims.write_outcomes(own, "w", batch),)
    )
    with psycopg.connect(db_url) as blocker:
        blocker.execute("SELECT 1 FROM rota.job WHERE id = %s FOR UPDATE", (b,))
        heartbeat.start()
        wait_for(lambda: waiting_for_a_lock() == 1, what="the heartbeat to wait")
        outcomes.start()
        wait_for(lambda: waiting_for_a_lock() == 2, what="the outcomes to wait")
        blocker.commit()
    heartbeat.join(30)
    outcomes.join(30)
    assert failures == []
    assert [row(conn, job_id)["status"] for job_id in (a, b, c)] == ["done"] * 3


def test_heartbeat_extends_only_leases_still_held(conn: psycopg.Connection[Any]) -> None:
    a, b = rota.enqueue_many(conn, [rota.NewJob("t"), rota.NewJob("t")], now=T0)
    claims.claim(conn, "w1", 10, 30, now=at(0))
    conn.execute("UPDATE rota.job SET locked_by = 'thief' WHERE id = %s", (b,))
    kept = claims.extend_leases(conn, "w1", [(a, 1), (b, 1)], 30, now=at(20))
    assert {lease.job_id for lease in kept} == {a}
    assert row(conn, a)["locked_until"] == at(50)


def test_outcomes(conn: psycopg.Connection[Any]) -> None:
    ids = rota.enqueue_many(
        conn, [rota.NewJob("t", max_attempts=m) for m in (5, 5, 5, 1, 5)], now=T0
    )
    claims.claim(conn, "w", 10, 30, now=at(0))
    written = claims.write_outcomes(
        conn,
        "w",
        [
            Attempt(ids[0], 1, Outcome.DONE, claim=1),
            Attempt(ids[1], 1, Outcome.FAILED, error="Permanent: bad payload", claim=1),
            Attempt(ids[2], 1, Outcome.RETRY, 10, "ValueError: x", claim=1),
            Attempt(ids[3], 1, Outcome.RETRY, 10, "ValueError: y", claim=1),
            Attempt(ids[4], 1, Outcome.RELEASED, 0, "Released: worker shut down", claim=1),
        ],
        now=at(5),
    )
    assert {job_id: status for (job_id, _), status in written.items()} == {
        ids[0]: "done",
        ids[1]: "failed",
        ids[2]: "ready",
        ids[3]: "dead",
        ids[4]: "ready",
    }
    assert row(conn, ids[0])["finished_at"] == at(5)
    retried = row(conn, ids[2])
    assert (retried["run_at"], retried["attempts"], retried["last_error"]) == (
        at(15),
        1,
        "ValueError: x",
    )
    assert row(conn, ids[3])["finished_at"] == at(5)
    released = row(conn, ids[4])
    assert (released["attempts"], released["run_at"]) == (0, at(5))


def test_a_job_that_goes_dead_keeps_the_time_it_was_due(conn: psycopg.Connection[Any]) -> None:
    # A retry past max_attempts, by the worker or by the reaper, wrote a run_at
    # of now plus a backoff: `rota dead list` showed a dead job due later.
    ids = rota.enqueue_many(conn, [rota.NewJob("t", max_attempts=1) for _ in range(2)], now=T0)
    claims.claim(conn, "w", 10, 30, now=at(0))
    written = claims.write_outcomes(
        conn, "w", [Attempt(ids[0], 1, Outcome.RETRY, 10, "ValueError: x", claim=1)], now=at(5)
    )
    assert list(written.values()) == ["dead"]
    assert Reaper().run_once(conn, now=at(31)).dead == [ids[1]]
    for job_id in ids:
        r = row(conn, job_id)
        assert (r["status"], r["run_at"]) == ("dead", T0)


ODD_ERRORS = ["", "NULL", "a,b", 'say "hi"', "back\\slash", '\\"', "{x}", "two\nlines", "ünï", " "]


def test_errors_and_delays_of_any_spelling_are_written_as_given(
    conn: psycopg.Connection[Any],
) -> None:
    # The outcome statement's arrays are written as array literals by rota.claim.
    ids = rota.enqueue_many(conn, [rota.NewJob("t") for _ in ODD_ERRORS], now=T0)
    claims.claim(conn, "w", 100, 30, now=at(0))
    delays = [0.25 * i + 1e-05 for i in range(len(ids))]
    batch = [
        Attempt(job_id, 1, Outcome.RETRY, delay, error, claim=1)
        for job_id, delay, error in zip(ids, delays, ODD_ERRORS, strict=True)
    ]
    claims.write_and_claim(conn, "w", batch, 1, 30, now=at(5))
    for job_id, delay, error in zip(ids, delays, ODD_ERRORS, strict=True):
        r = row(conn, job_id)
        assert (r["last_error"], r["run_at"]) == (error, at(5 + delay))


def test_a_late_finisher_whose_lease_was_taken_changes_nothing(
    conn: psycopg.Connection[Any],
) -> None:
    job_id = rota.enqueue(conn, "t", now=T0)
    claims.claim(conn, "slow", 1, 30, now=at(0))
    Reaper().run_once(conn, now=at(31))
    [again] = claims.claim(conn, "fast", 1, 30, now=at(33))
    assert again.attempts == 2
    assert (
        claims.write_outcomes(conn, "slow", [Attempt(job_id, 1, Outcome.DONE, claim=1)], now=at(40))
        == {}
    )
    assert row(conn, job_id)["status"] == "running"
    assert claims.write_outcomes(
        conn, "fast", [Attempt(job_id, 2, Outcome.DONE, claim=2)], now=at(41)
    )
    assert row(conn, job_id)["status"] == "done"


def test_reaper_requeues_expired_leases_and_counts_them_by_hour(
    conn: psycopg.Connection[Any],
) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t", max_attempts=m) for m in (3, 1, 3)], now=T0)
    claims.claim(conn, "w", 10, 30, now=at(0))
    claims.extend_leases(conn, "w", [(ids[2], 1)], 600, now=at(10))
    result = Reaper().run_once(conn, now=at(31))
    assert (result.requeued, result.dead) == ([ids[0]], [ids[1]])
    assert row(conn, ids[0])["status"] == "ready"
    assert "LeaseExpired" in row(conn, ids[0])["last_error"]
    assert row(conn, ids[1])["status"] == "dead"
    assert row(conn, ids[2])["status"] == "running"
    assert Reaper().run_once(conn, now=at(32)).count == 0
    hours = conn.execute("SELECT hour, count FROM rota.lease_expiration").fetchall()
    assert hours == [{"hour": T0, "count": 2}]


def test_reaper_works_in_capped_batches_and_many_reapers_do_not_double(db_url: str) -> None:
    rota.enqueue_many(db_url, [rota.NewJob("t") for _ in range(1000)], now=T0)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:  # type: ignore[arg-type]
        claims.claim(c, "w", 1000, 30, now=at(0))
    results = []

    def reap() -> None:
        results.append(Reaper(ReaperSettings(batch_size=37)).run_once(db_url, now=at(60)))

    threads = [threading.Thread(target=reap) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reset = [i for r in results for i in r.requeued]
    assert len(reset) == 1000 == len(set(reset))
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT sum(count) FROM rota.lease_expiration").fetchone() == (1000,)
        assert c.execute("SELECT count(*) FROM rota.job WHERE status = 'ready'").fetchone() == (
            1000,
        )


def test_dead_jobs_come_back_with_fresh_attempts(conn: psycopg.Connection[Any]) -> None:
    a, b, c = rota.enqueue_many(conn, [rota.NewJob("t", max_attempts=1) for _ in range(3)], now=T0)
    claims.claim(conn, "w", 10, 30, now=at(0))
    claims.write_outcomes(
        conn,
        "w",
        [Attempt(i, 1, Outcome.RETRY, 1, "boom", claim=1) for i in (a, b)]
        + [Attempt(c, 1, Outcome.DONE, claim=1)],
        now=at(1),
    )
    assert retry_dead(conn, [a, c], now=at(2)) == [a]
    r = row(conn, a)
    assert (r["status"], r["attempts"], r["run_at"], r["last_error"]) == ("ready", 0, at(2), "boom")
    assert retry_dead(conn, all_dead=True, now=at(3)) == [b]
    assert row(conn, c)["status"] == "done"


def test_queue_age_counts_only_jobs_that_could_run(conn: psycopg.Connection[Any]) -> None:
    assert queue_age(conn, now=T0).ready_jobs == 0
    rota.enqueue(conn, "a", now=T0)
    rota.enqueue(conn, "b", now=at(30))
    rota.enqueue(conn, "a", delay=600, now=T0)
    age = queue_age(conn, now=at(100))
    assert (age.oldest_ready_age_seconds, age.ready_jobs) == (100, 2)
    assert queue_age(conn, ["b"], now=at(100)).oldest_ready_age_seconds == 70


def test_complete_in_the_handlers_own_transaction(db_url: str) -> None:
    rota.enqueue(db_url, "t", key="order-1", now=T0)
    with psycopg.connect(db_url, row_factory=dict_row) as c:  # type: ignore[arg-type]
        c.execute("CREATE TABLE shipped (key text PRIMARY KEY)")
        [job] = claims.claim(c, "w", 1, 30, now=at(0))
        c.commit()
        with c.transaction():
            c.execute("INSERT INTO shipped VALUES (%s)", (job.effect_key,))
            assert rota.complete(c, job, now=at(1))
        assert c.execute("SELECT status FROM rota.job").fetchone() == {"status": "done"}
        # A rerun that lost its lease cannot complete, so its effect rolls back.
        stale = job
        with pytest.raises(RuntimeError), c.transaction():
            c.execute("INSERT INTO shipped VALUES ('again')")
            if not rota.complete(c, stale, now=at(2)):
                raise RuntimeError("lease lost")
        assert c.execute("SELECT count(*) AS n FROM shipped").fetchone() == {"n": 1}


def test_complete_stores_the_result_it_is_given(db_url: str) -> None:
    rota.enqueue(db_url, "t", now=T0)
    with psycopg.connect(db_url, row_factory=dict_row) as c:  # type: ignore[arg-type]
        [job] = claims.claim(c, "w", 1, 30, now=at(0))
        c.commit()
        with pytest.raises(InvalidInput, match="not JSON"):
            rota.complete(c, job, now=at(1), result={"at": object()})
        assert rota.complete(c, job, now=at(1), result={"url": "s3://a", "n": 2})
        c.commit()
    assert rota.result(db_url, job.id) == (rota.Status.DONE, {"url": "s3://a", "n": 2})


def test_an_attempt_told_to_stop_cannot_complete_though_it_keeps_its_row(db_url: str) -> None:
    # Past its timeout a thread that ignores its stop keeps its lease (so that no
    # second handler starts in its place), but its completion is refused.
    rota.enqueue(db_url, "t", now=T0)
    with psycopg.connect(db_url, row_factory=dict_row) as c:  # type: ignore[arg-type]
        [job] = claims.claim(c, "w", 1, 30, now=at(0))
        c.commit()
        job.cancelled.set()
        with c.transaction():
            assert not rota.complete(c, job, now=at(1))
        row = c.execute("SELECT status, locked_by FROM rota.job").fetchone()
        assert row == {"status": "running", "locked_by": "w"}


def test_effect_markers_make_a_rerun_skip_the_effect(conn: psycopg.Connection[Any]) -> None:
    rota.enqueue(conn, "t", key="invoice-7")
    [job] = claims.claim(conn, "w", 1, 30)
    assert rota.record_effect(conn, job, "charge", {"amount": 10})
    assert not rota.record_effect(conn, job, "charge", {"amount": 10})
    assert rota.effect_result(conn, job, "charge") == {"amount": 10}
    assert rota.effect_result(conn, job, "refund") is None


def test_the_reaper_retries_an_expired_job_after_its_backoff(conn) -> None:
    # A job that kills its worker (OOM, say) came back at once, up to 20 times,
    # each crash expiring every job beside it: it backs off like a failing job.
    ids = rota.enqueue_many(conn, [rota.NewJob("t"), rota.NewJob("t")])
    conn.execute("UPDATE rota.job SET attempts = 3, run_at = %s", (T0,))
    claims.claim(conn, "w", 2, 30, now=T0)  # attempt 4 of each
    later = T0 + timedelta(seconds=31)
    fixed = BackoffSettings(base_seconds=10, cap_seconds=3600, jitter=0)
    result = Reaper(ReaperSettings(backoff=fixed)).run_once(conn, now=later)
    assert sorted(result.requeued) == sorted(ids)
    assert [row(conn, i)["run_at"] for i in ids] == [later + timedelta(seconds=80)] * 2
    assert [row(conn, i)["attempts"] for i in ids] == [4, 4]  # still counted
    # The default backoff (1 s doubled, a quarter of jitter either way).
    rota.enqueue(conn, "u")
    conn.execute("UPDATE rota.job SET run_at = %s WHERE type = 'u'", (T0,))
    (job,) = claims.claim(conn, "w", 1, 30, ["u"], now=T0)
    Reaper().run_once(conn, now=later)
    wait = (row(conn, job.id)["run_at"] - later).total_seconds()
    assert 0.75 <= wait <= 1.25
