"""A run whose lease was taken away writes nothing, even when the same worker
claims the job again at the same attempt number.

The attempt number goes down when an attempt is given back uncounted (a
durable run that stored a step and lost its lease, a suspension) and to 0 when
a dead job is retried: the next claim by the same worker is then attempt 1
again. A claim's own number (`claims`, counted by every claim and never
lowered) tells the two runs apart; the attempt number alone did not, and the
old run's outcome, steps and children were taken as the new run's (time
injected throughout)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import rota
from rota import claim as claims
from rota import control
from rota.attempt import key_of
from rota.durable import Run, wake_due
from rota.errors import LeaseLost, Suspended
from rota.jobs import Job
from rota.reaper import Reaper
from tests.durable.helpers import later, row

WORKER = "w"
LEASE = 30


def _progressed_and_reaped(conn: Any, db_url: str, job: Job) -> None:
    run = Run(db_url, WORKER, job, now=job.started_at)
    run.step("a", lambda: 1)
    run.close()
    assert Reaper().run_once(conn, now=later(conn, 2 * LEASE)).requeued == [job.id]


def _dead_and_retried(conn: Any, db_url: str, job: Job) -> None:
    assert Reaper().run_once(conn, now=later(conn, 2 * LEASE)).dead == [job.id]
    assert control.retry(conn, [job.id], now=later(conn, 2 * LEASE)) == [job.id]


def _suspended_and_woken(conn: Any, db_url: str, job: Job) -> None:
    run = Run(db_url, WORKER, job, now=job.started_at)
    with pytest.raises(Suspended):  # a handler that catches it runs on
        run.sleep(1)
    run.close()
    assert wake_due(conn, later(conn, 2 * LEASE), 10) == [job.id]


GIVEN_BACK: dict[str, Callable[[Any, str, Job], None]] = {
    "a progressed run reaped": _progressed_and_reaped,
    "a dead job retried": _dead_and_retried,
    "a suspension woken": _suspended_and_woken,
}


@pytest.mark.parametrize("given_back", GIVEN_BACK.values(), ids=GIVEN_BACK.keys())
def test_the_old_run_writes_nothing_beside_the_new_one(conn, db_url, given_back) -> None:
    job_id = rota.enqueue(conn, "t", max_attempts=1)
    [old] = claims.claim(conn, WORKER, 1, LEASE, now=later(conn, 0))
    given_back(conn, db_url, old)
    [new] = claims.claim(conn, WORKER, 1, LEASE, now=later(conn, 3 * LEASE))
    assert (new.id, new.attempts) == (old.id, old.attempts) == (job_id, 1)
    assert key_of(new) != key_of(old)

    at = later(conn, 3 * LEASE + 1)
    assert claims.extend_leases(conn, WORKER, [key_of(old)], LEASE, now=at) == []
    assert not claims.complete(conn, old, now=at)
    stale = Run(db_url, WORKER, old, now=at)
    with pytest.raises(LeaseLost):
        stale.step("b", lambda: 2)
    with pytest.raises(LeaseLost):
        stale.spawn("child", {})
    stale.close()
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 1
    assert (
        conn.execute("SELECT count(*) AS n FROM rota.job_step WHERE name = 'b'").fetchone()["n"]
        == 0
    )
    assert (row(conn, job_id)["status"], row(conn, job_id)["locked_by"]) == ("running", WORKER)

    # The new run holds its lease and ends the job.
    assert [lease.job_id for lease in claims.extend_leases(conn, WORKER, [key_of(new)], LEASE)]
    assert claims.complete(conn, new)
    assert row(conn, job_id)["status"] == "done"


def test_every_claim_counts_and_nothing_lowers_the_count(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "t", max_attempts=1)
    [first] = claims.claim(conn, WORKER, 1, LEASE, now=later(conn, 0))
    _dead_and_retried(conn, db_url, first)
    [second] = claims.claim(conn, WORKER, 1, LEASE, now=later(conn, 3 * LEASE))
    assert (first.claims, second.claims) == (1, 2)
    assert row(conn, job_id)["claims"] == 2
    assert timedelta(0) <= second.started_at - first.started_at
