"""A durable job whose worker died: the run that stored a step since it was
claimed is not charged an attempt and is ready at once; a run that stored
nothing new is charged, so a job that kills its worker before its next step
still ends dead (time injected into the claim and the reaper)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

import rota
from rota.claim import claim
from rota.durable import Run
from rota.jobs import Job
from rota.reaper import Reaper
from tests.durable.helpers import later, row

LEASE = 60


def _claim(conn: Any, now: datetime | None = None) -> Job:
    [job] = claim(conn, "w", 1, LEASE, now=now)
    return job


def _crash_after(db_url: str, job: Job, *steps: str) -> None:
    """The run stores `steps` (at the time it was claimed) and its worker dies:
    nothing more is written."""
    run = Run(db_url, "w", job, now=job.started_at)
    for name in steps:
        run.step(name, lambda name=name: name)
    run.close()


def _reap(db_url: str, at: datetime) -> list[int]:
    return Reaper().run_once(db_url, now=at).requeued


def test_a_run_that_stored_a_step_is_not_charged(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "t", max_attempts=1)
    _crash_after(db_url, _claim(conn), "a", "b")
    at = later(conn, 2 * LEASE)
    assert _reap(db_url, at) == [job_id]
    back = row(conn, job_id)
    assert (back["status"], back["attempts"], back["run_at"]) == ("ready", 0, at)
    assert "not counted" in back["last_error"]


def test_a_run_that_stored_nothing_new_is_charged(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "t", max_attempts=2)
    _crash_after(db_url, _claim(conn), "a")
    first = later(conn, 2 * LEASE)
    _reap(db_url, first)

    # The next run finds "a" stored and dies before a step of its own: charged.
    _crash_after(db_url, _claim(conn, now=first), "a")
    second = later(conn, 4 * LEASE)
    _reap(db_url, second)
    assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("ready", 1)

    _claim(conn, now=later(conn, 6 * LEASE))  # dies before any step: charged, its last
    Reaper().run_once(db_url, now=later(conn, 8 * LEASE))
    assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("dead", 2)


def test_a_job_that_stores_a_step_and_dies_every_time_is_charged_after_ten(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "t", max_attempts=1)
    at = None
    for i in range(11):
        _crash_after(db_url, _claim(conn, now=at), f"step-{i}")
        at = later(conn, (i + 1) * 2 * LEASE)
        Reaper().run_once(db_url, now=at)
        if i < 10:
            assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("ready", 0)
    assert (row(conn, job_id)["status"], row(conn, job_id)["attempts"]) == ("dead", 1)


def test_the_reaper_wakes_when_the_earliest_lease_expires(conn, db_url) -> None:
    reaper = Reaper()
    assert reaper.next_wait(conn) == reaper.settings.interval_seconds  # nothing running
    rota.enqueue(conn, "t")
    claim(conn, "w", 1, 2.0)
    assert 0 < reaper.next_wait(conn) <= 2.01
    conn.execute("UPDATE rota.job SET locked_until = now() - interval '1 minute'")
    assert reaper.next_wait(conn) == 0.01  # expired already: at once


def test_a_durable_job_given_back_at_once_wakes_idle_workers(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "t")
    _crash_after(db_url, _claim(conn), "a")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN rota_jobs")
        assert _reap(db_url, later(conn, 2 * LEASE)) == [job_id]
        heard = [n.channel for n in listener.notifies(timeout=10, stop_after=1)]
    assert heard == ["rota_jobs"]
