"""Sleeps and waits: the job leaves its worker (waiting, slot freed, attempt not
counted) and comes back when its time comes or its event is emitted."""

from __future__ import annotations

import collections
import threading
from datetime import timedelta
from typing import Any

import pytest

import rota
from rota.archive import Archiver
from rota.durable import wake_due
from rota.jobs import Job
from rota.reaper import Reaper, ReaperSettings
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.durable.helpers import handlers, later, row, running, until_status

ran: collections.Counter[str] = collections.Counter()
"""Effects of this module's steps, by job and step (each test starts from none)."""


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    ran.clear()


def naps(job: Job, ctx: rota.Context) -> Any:
    ctx.step("before", lambda: ran.update([f"{job.id}:before"]))
    ctx.sleep(3600)
    ctx.step("after", lambda: ran.update([f"{job.id}:after"]))
    return "rested"


def quick(job: Job, ctx: rota.Context) -> Any:
    return "quick"


def waits(job: Job, ctx: rota.Context) -> Any:
    try:
        return {"got": ctx.wait_for(job.payload["key"], timeout=job.payload.get("timeout"))}
    except rota.TimedOut:
        return "timed out"


async def async_waits(job: Job, ctx: rota.Context) -> Any:
    await ctx.sleep(60)
    return await ctx.wait_for(job.payload["key"])


HANDLERS = handlers(naps=naps, quick=quick, waits=waits, async_waits=async_waits)


def test_an_hour_of_sleep_frees_the_slot_at_once_and_resumes_after(conn, db_url) -> None:
    sleeper = rota.enqueue(conn, "naps")
    with running(db_url, HANDLERS, concurrency=1) as worker:
        asleep = until_status(conn, sleeper, "waiting")
        # The only slot is free: a job enqueued now runs while the first one sleeps.
        other = rota.enqueue(conn, "quick")
        until_status(conn, other, "done")
        assert asleep["attempts"] == 0  # a suspension counts no attempt
        assert asleep["locked_until"] is None
        assert Reaper().run_once(db_url, now=later(conn, 3599)).woken == []
        assert row(conn, sleeper)["status"] == "waiting"
        assert Reaper().run_once(db_url, now=later(conn, 3601)).woken == [sleeper]
        done = until_status(conn, sleeper, "done")
        assert worker is not None
    assert done["result"] == "rested"
    assert (ran[f"{sleeper}:before"], ran[f"{sleeper}:after"]) == (1, 1)
    waits = conn.execute("SELECT * FROM rota.job_wait WHERE job_id = %s", (sleeper,)).fetchall()
    assert [(w["name"], w["ended_by"]) for w in waits] == [("sleep:1", "time")]


def test_an_emit_wakes_the_jobs_waiting_on_its_key(conn, db_url) -> None:
    first = rota.enqueue(conn, "waits", {"key": "order-1:shipped", "timeout": 600})
    second = rota.enqueue(conn, "waits", {"key": "order-1:shipped"})
    with running(db_url, HANDLERS, concurrency=2):
        until_status(conn, first, "waiting")
        until_status(conn, second, "waiting")
        assert rota.emit(conn, "order-1:shipped", {"parcel": 7}) == 2
        assert until_status(conn, first, "done")["result"] == {"got": {"parcel": 7}}
        assert until_status(conn, second, "done")["result"] == {"got": {"parcel": 7}}


def test_an_emit_before_the_wait_is_kept_and_the_first_emit_wins(conn, db_url) -> None:
    assert rota.emit(conn, "early", "first") == 0
    assert conn.execute("SELECT rota.emit('early', '\"second\"') AS n").fetchone()["n"] == 0
    job_id = rota.enqueue(conn, "waits", {"key": "early"})
    with running(db_url, HANDLERS, concurrency=1):
        done = until_status(conn, job_id, "done")
    assert done["result"] == {"got": "first"}
    assert done["attempts"] == 1  # it never waited


def test_a_wait_past_its_timeout_raises_timed_out(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "waits", {"key": "never", "timeout": 30})
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
        assert wake_due(db_url, now=later(conn, 29)) == []
        assert wake_due(db_url, now=later(conn, 31)) == [job_id]
        assert until_status(conn, job_id, "done")["result"] == "timed out"
    # An emit after the timeout wakes nobody and changes nothing.
    assert rota.emit(conn, "never", 1) == 0


def test_sql_emit_wakes_an_async_handler_after_its_sleep(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "async.waits", {"key": "from-sql"})
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
        wake_due(db_url, now=later(conn, 61))
        wait = "SELECT 1 FROM rota.job_wait WHERE job_id = %s AND name = 'event:from-sql'"
        wait_for(lambda: conn.execute(wait, (job_id,)).fetchone(), what="the event wait")
        woken = conn.execute("SELECT rota.emit('from-sql', '[1, 2]') AS n").fetchone()["n"]
        assert woken == 1
        assert until_status(conn, job_id, "done")["result"] == [1, 2]


def test_bad_waits_are_refused(conn, db_url) -> None:
    with pytest.raises(rota.InvalidInput):
        rota.emit(conn, "", None)
    with pytest.raises(rota.InvalidInput):
        rota.emit(conn, "k", object())


def naps_briefly(job: Job, ctx: rota.Context) -> Any:
    ctx.sleep(0.5)
    return "rested"


def test_a_short_sleep_brings_the_reapers_next_pass_forward(conn, db_url) -> None:
    # The reaper's passes are far apart (30 s): only the suspension itself can
    # bring the next one forward to the sleep's end.
    settings = WorkerSettings(
        concurrency=1,
        run_scheduler=False,
        poll_interval_seconds=0.2,
        reaper=ReaperSettings(interval_seconds=30),
    )
    worker = Worker(db_url, settings, handlers=handlers(naps_briefly=naps_briefly))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        job_id = rota.enqueue(conn, "naps.briefly")
        assert until_status(conn, job_id, "done")["result"] == "rested"
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    late = conn.execute(
        "SELECT ended_at - until AS late FROM rota.job_wait WHERE job_id = %s", (job_id,)
    ).fetchone()["late"]
    assert late < timedelta(seconds=1.5), late


def sleeps_after_its_stop(job: Job, ctx: rota.Context) -> Any:
    assert job.cancelled.wait(30), "the attempt was not stopped"
    ctx.sleep(3600)
    return "slept"


def test_a_stopped_attempt_does_not_wait(conn, db_url) -> None:
    # As it starts no new step: the attempt ends as its stop (a timeout) says.
    job_id = rota.enqueue(conn, "sleeps.after.its.stop", timeout=0.5, max_attempts=1)
    stops = handlers(sleeps_after_its_stop=sleeps_after_its_stop)
    with running(db_url, stops, concurrency=1):
        found = until_status(conn, job_id, "dead", "waiting", "failed", "done")
    assert (found["status"], found["attempts"]) == ("dead", 1)
    assert found["last_error"].startswith("Timeout: the attempt ran longer"), found["last_error"]
    waits = conn.execute("SELECT name FROM rota.job_wait WHERE job_id = %s", (job_id,))
    assert waits.fetchall() == []


def waits_again(job: Job, ctx: rota.Context) -> Any:
    try:
        return {"first": ctx.wait_for("parcel", timeout=30)}
    except rota.TimedOut:
        pass
    try:
        return {"second": ctx.wait_for("parcel", timeout=3600)}
    except rota.TimedOut as timed_out:
        return str(timed_out)


def test_a_second_wait_on_a_key_waits_anew_after_the_first_timed_out(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "waits.again")
    with running(db_url, handlers(waits_again=waits_again), concurrency=1):
        until_status(conn, job_id, "waiting")
        assert wake_due(db_url, now=later(conn, 31)) == [job_id]
        # The first wait timed out; the second one waits, with its own timeout.
        found = until_status(conn, job_id, "waiting", "done")
        assert found["status"] == "waiting", found["result"]
        assert wake_due(db_url, now=later(conn, 3000)) == []
        assert rota.emit(conn, "parcel", {"n": 1}) == 1
        assert until_status(conn, job_id, "done")["result"] == {"second": {"n": 1}}
    waits = conn.execute(
        "SELECT name, ended_by FROM rota.job_wait WHERE job_id = %s ORDER BY started_at, name",
        (job_id,),
    ).fetchall()
    assert [(w["name"], w["ended_by"]) for w in waits] == [
        ("event:parcel", "time"),
        ("event#2:parcel", "event"),
    ]


def waits_then_naps(job: Job, ctx: rota.Context) -> Any:
    try:
        got = ctx.wait_for(job.payload["key"], timeout=3600)
    except rota.TimedOut:
        return "timed out"
    ctx.sleep(60)
    return {"got": got}


def asleep(conn: Any, job_id: int) -> bool:
    """The job waits on its sleep, past its event wait."""
    sleep = "SELECT 1 FROM rota.job_wait WHERE job_id = %s AND name = 'sleep:1'"
    waiting = row(conn, job_id)["status"] == "waiting"
    return waiting and conn.execute(sleep, (job_id,)).fetchone() is not None


def test_a_wait_that_got_its_event_keeps_its_payload_once_the_event_is_deleted(
    conn, db_url
) -> None:
    # The archive deletes events after their retention (30 days); a job that
    # got one and slept on read it again by key on its next run, and took the
    # timeout's path (or a later emit's payload) once it was gone.
    found = handlers(waits_then_naps=waits_then_naps)
    woken = rota.enqueue(conn, "waits.then.naps", {"key": "parcel"})
    bare = rota.enqueue(conn, "waits.then.naps", {"key": "bare"})
    with running(db_url, found, concurrency=2):
        until_status(conn, woken, "waiting")
        until_status(conn, bare, "waiting")
        assert rota.emit(conn, "parcel", {"tracking": "1Z999"}) == 1
        assert rota.emit(conn, "bare") == 1
        late = rota.enqueue(conn, "waits.then.naps", {"key": "parcel"})  # finds it emitted
        for job_id in (woken, bare, late):
            wait_for(lambda j=job_id: asleep(conn, j), what=f"job {job_id} asleep after its wait")
    assert Archiver().run_once(db_url, now=later(conn, 31 * 86400)).events == 2
    assert rota.emit(conn, "parcel", {"tracking": "another parcel"}) == 0
    with running(db_url, found, concurrency=2):
        assert sorted(wake_due(db_url, now=later(conn, 61))) == sorted([woken, bare, late])
        results = [until_status(conn, j, "done")["result"] for j in (woken, bare, late)]
    parcel = {"got": {"tracking": "1Z999"}}
    assert results == [parcel, {"got": None}, parcel]


def test_a_wait_ended_before_its_payload_was_kept_fails_its_job_on_a_later_run(
    conn, db_url
) -> None:
    # A wait that ended by event before migration 0044, its event deleted before
    # the migration ran: the payload is nowhere, and neither the timeout's path
    # nor None would be what the first run got.
    found = handlers(waits_then_naps=waits_then_naps)
    rota.emit(conn, "lost", {"n": 1})
    job_id = rota.enqueue(conn, "waits.then.naps", {"key": "lost"})
    with running(db_url, found, concurrency=1):
        wait_for(lambda: asleep(conn, job_id), what=f"job {job_id} asleep after its wait")
        conn.execute("UPDATE rota.job_wait SET payload = NULL WHERE job_id = %s", (job_id,))
        assert wake_due(db_url, now=later(conn, 61)) == [job_id]
        failed = until_status(conn, job_id, "failed", "done")
    assert failed["status"] == "failed", failed["result"]
    assert "the payload of event 'lost' is gone" in failed["last_error"], failed["last_error"]


caught: dict[int, list[str]] = {}
"""What the durable calls after a swallowed suspension raised, by job."""


def again(job: Job, calls: list[Any]) -> None:
    """Make each call, noting what it raised (the handler goes on regardless)."""
    seen = []
    for make in calls:
        try:
            make()
            seen.append("nothing")
        except Exception as exc:
            seen.append(type(exc).__name__)
    caught[job.id] = seen


def swallows_its_suspension(job: Job, ctx: rota.Context) -> Any:
    try:
        shipped = ctx.wait_for(f"shipped:{job.id}", timeout=3600)
    except Exception:  # meant for rota.TimedOut: catches rota.Suspended too
        refund = lambda: ran.update([f"{job.id}:refund"])  # noqa: E731
        again(job, [
            lambda: ctx.step("refund", refund),
            lambda: ctx.spawn("quick"),
            lambda: ctx.sleep(1),
            lambda: ctx.wait_for(f"other:{job.id}"),
            lambda: ctx.gather([]),
        ])  # fmt: skip
        return {"status": "cancelled"}
    return {"status": "shipped", "tracking": shipped["tracking"]}


async def swallows_its_suspension_async(job: Job, ctx: rota.Context) -> Any:
    try:
        shipped = await ctx.wait_for(f"shipped:{job.id}", timeout=3600)
    except Exception:
        refund = lambda: ran.update([f"{job.id}:refund"])  # noqa: E731
        calls = [
            lambda: ctx.step("refund", refund),
            lambda: ctx.spawn("quick"),
            lambda: ctx.sleep(1),
            lambda: ctx.wait_for(f"other:{job.id}"),
            lambda: ctx.gather([]),
        ]
        seen = []
        for make in calls:
            try:
                await make()
                seen.append("nothing")
            except Exception as exc:
                seen.append(type(exc).__name__)
        caught[job.id] = seen
        return {"status": "cancelled"}
    return {"status": "shipped", "tracking": shipped["tracking"]}


@pytest.mark.parametrize("job_type", ["swallows.its.suspension", "swallows.its.suspension.async"])
def test_a_handler_that_swallows_its_suspension_does_nothing_more(conn, db_url, job_type) -> None:
    # Caught by `except Exception`, rota.Suspended let the timeout branch run
    # its step's function (a refund sent, its storing refused), and the job
    # the event later ended done.
    job_id = rota.enqueue(conn, job_type)
    swallowing = handlers(
        swallows_its_suspension=swallows_its_suspension,
        swallows_its_suspension_async=swallows_its_suspension_async,
        quick=quick,
    )
    with running(db_url, swallowing, concurrency=1):
        wait_for(lambda: job_id in caught, what="the handler's calls after its suspension")
        assert caught[job_id] == ["Suspended"] * 5
        assert until_status(conn, job_id, "waiting")["attempts"] == 0
        rota.emit(conn, f"shipped:{job_id}", {"tracking": "1Z999"})
        done = until_status(conn, job_id, "done", "failed", "dead")
    assert done["result"] == {"status": "shipped", "tracking": "1Z999"}, done["last_error"]
    assert ran[f"{job_id}:refund"] == 0
    left = conn.execute(
        "SELECT (SELECT count(*) FROM rota.job_step WHERE job_id = %(job)s) AS steps,"
        " (SELECT count(*) FROM rota.job_wait WHERE job_id = %(job)s) AS waits,"
        " (SELECT count(*) FROM rota.job WHERE parent_id = %(job)s) AS children",
        {"job": job_id},
    ).fetchone()
    assert left == {"steps": 0, "waits": 1, "children": 0}
