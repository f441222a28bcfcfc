"""Children: spawned once per parent and name, gathered once every one has ended."""

from __future__ import annotations

import collections
from typing import Any

import pytest

import rota
from rota import control
from rota.jobs import Job, Status
from tests.acceptance.procs import wait_for
from tests.durable.helpers import handlers, row, running, until_status

ran: collections.Counter[str] = collections.Counter()
"""Effects of this module's steps, by job and step (each test starts from none)."""


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    ran.clear()


def fan_out(job: Job, ctx: rota.Context) -> Any:
    ids = [ctx.spawn("double", {"n": n}) for n in range(job.payload["children"])]
    results = ctx.gather(ids)
    ctx.step("sum", lambda: ran.update([f"{job.id}:sum"]))
    return sum(results)


def double(job: Job, ctx: rota.Context) -> Any:
    return 2 * job.payload["n"]


def compensates(job: Job, ctx: rota.Context) -> Any:
    ok = ctx.spawn("double", {"n": 1}, name="fine")
    bad = ctx.spawn("breaks", name="broken", max_attempts=1)
    try:
        ctx.gather([ok, bad])
    except rota.ChildFailed as failed:
        return {"compensated": failed.child_id, "status": failed.status}
    return "no failure"


def breaks(job: Job, ctx: rota.Context) -> Any:
    raise rota.Permanent("out of stock")


def waits_on_late_children(job: Job, ctx: rota.Context) -> Any:
    late = [ctx.spawn("double", {"n": n}, delay=3600) for n in range(2)]
    return ctx.gather(late)


HANDLERS = handlers(
    fan_out=fan_out,
    double=double,
    compensates=compensates,
    breaks=breaks,
    waits_on_late_children=waits_on_late_children,
)


def test_children_fan_in_to_their_parent(conn, db_url) -> None:
    parent = rota.enqueue(conn, "fan.out", {"children": 3})
    with running(db_url, HANDLERS, concurrency=2):
        done = until_status(conn, parent, "done")
    assert done["result"] == 2 * (0 + 1 + 2)
    children = conn.execute(
        "SELECT c.name, j.status FROM rota.job_child c JOIN rota.job j ON j.id = c.child_id"
        " WHERE c.parent_id = %s ORDER BY c.name",
        (parent,),
    ).fetchall()
    assert [(c["name"], c["status"]) for c in children] == [
        ("1", "done"),
        ("2", "done"),
        ("3", "done"),
    ]
    assert ran[f"{parent}:sum"] == 1


def test_a_thousand_children_fan_in_exactly_once(conn, db_url) -> None:
    parent = rota.enqueue(conn, "fan.out", {"children": 1000})
    with running(db_url, HANDLERS, concurrency=8):
        done = until_status(conn, parent, "done")
    assert done["result"] == 2 * sum(range(1000))
    assert ran[f"{parent}:sum"] == 1
    counts = conn.execute(
        "SELECT count(*) AS n, count(DISTINCT id) AS ids, min(attempts) AS lo, max(attempts) AS hi"
        " FROM rota.job WHERE parent_id = %s",
        (parent,),
    ).fetchone()
    assert (counts["n"], counts["ids"], counts["lo"], counts["hi"]) == (1000, 1000, 1, 1)


def test_a_dead_child_raises_child_failed_in_its_parent(conn, db_url) -> None:
    parent = rota.enqueue(conn, "compensates")
    with running(db_url, HANDLERS, concurrency=2):
        done = until_status(conn, parent, "done")
    broken = conn.execute(
        "SELECT child_id FROM rota.job_child WHERE parent_id = %s AND name = 'broken'", (parent,)
    ).fetchone()["child_id"]
    assert done["result"] == {"compensated": broken, "status": "failed"}


def test_cancelling_a_parent_cancels_its_children(conn, db_url) -> None:
    parent = rota.enqueue(conn, "waits.on.late.children")
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, parent, "waiting")
    children = [
        r["id"] for r in conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (parent,))
    ]
    assert len(children) == 2
    assert rota.cancel(conn, [parent]).ended == sorted([parent, *children])
    assert {row(conn, j)["status"] for j in [parent, *children]} == {"cancelled"}


BROKEN = {"on": True}
"""Whether `flaky.child` fails (it does until a test mends it)."""


def gathers_a_flaky_child(job: Job, ctx: rota.Context) -> Any:
    [result] = ctx.gather([ctx.spawn("flaky.child", max_attempts=1, name="flaky")])
    return result


def flaky_child(job: Job, ctx: rota.Context) -> Any:
    if BROKEN["on"]:
        raise rota.Permanent("the shop is closed")
    return 42


def test_a_child_retried_after_its_gather_ended_is_waited_for_again(conn, db_url) -> None:
    # As `rota dead retry --all` after an outage does: the child and its parent
    # back at once, the parent running first. Its gather had ended (the child
    # failed); it waits for the child again instead of failing on a child
    # that has not ended (ChildFailed with status ready).
    handled = handlers(gathers_a_flaky_child=gathers_a_flaky_child, flaky_child=flaky_child)
    BROKEN["on"] = True
    parent = rota.enqueue(conn, "gathers.a.flaky.child", max_attempts=1)
    with running(db_url, handled, concurrency=2):
        assert "ChildFailed" in until_status(conn, parent, "dead", "failed")["last_error"]
    [child] = [
        r["id"] for r in conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (parent,))
    ]
    assert row(conn, child)["status"] == "failed"
    BROKEN["on"] = False
    statuses = (Status.FAILED, Status.DEAD)
    assert control.retry(conn, [child, parent], statuses=statuses) == sorted([parent, child])
    conn.execute("UPDATE rota.job SET run_at = now() + interval '1 hour' WHERE id = %s", (child,))
    with running(db_url, handled, concurrency=2):
        until_status(conn, parent, "waiting", "dead", "failed")
        assert row(conn, parent)["status"] == "waiting"
        conn.execute("UPDATE rota.job SET run_at = now() WHERE id = %s", (child,))
        done = until_status(conn, parent, "done", "dead", "failed")
    assert (done["status"], done["result"]) == ("done", 42)


def gathers_a_stranger(job: Job, ctx: rota.Context) -> Any:
    return ctx.gather([job.payload["other"]])


def spawns_with_a_key(job: Job, ctx: rota.Context) -> Any:
    return ctx.spawn("double", {"n": 1}, key="once")


MISUSE = handlers(gathers_a_stranger=gathers_a_stranger, spawns_with_a_key=spawns_with_a_key)


@pytest.mark.parametrize(
    ("job_type", "error"),
    [
        ("gathers.a.stranger", "Permanent: jobs [{other}] are not children of job {job}"),
        ("spawns.with.a.key", "Permanent: spawn takes delay, group, max_attempts"),
    ],
)
def test_a_misused_spawn_or_gather_fails_the_job_at_once(conn, db_url, job_type, error) -> None:
    other = rota.enqueue(conn, "double", {"n": 1}, delay=3600)
    job_id = rota.enqueue(conn, job_type, {"other": other}, max_attempts=3)
    with running(db_url, MISUSE, concurrency=1):
        found = wait_for(lambda: ended_once(conn, job_id), what="the first attempt to end")
    assert (found["status"], found["attempts"]) == ("failed", 1)
    assert found["last_error"].startswith(error.format(other=other, job=job_id))


def ended_once(conn: Any, job_id: int) -> dict[str, Any] | None:
    """The job's row once its first attempt has ended (written), else None."""
    found = row(conn, job_id)
    return found if found["attempts"] and found["status"] != "running" else None


def spawns_after_its_stop(job: Job, ctx: rota.Context) -> Any:
    assert job.cancelled.wait(30), "the attempt was not stopped"
    return ctx.spawn("double", {"n": 1})


def test_a_stopped_attempt_spawns_no_child(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "spawns.after.its.stop", timeout=0.5, max_attempts=1)
    stops = handlers(spawns_after_its_stop=spawns_after_its_stop)
    with running(db_url, stops, concurrency=1):
        found = until_status(conn, job_id, "dead", "failed", "done")
    assert found["last_error"].startswith("Timeout: the attempt ran longer"), found["last_error"]
    children = conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (job_id,))
    assert children.fetchall() == []


async def spawns_awaited_backwards(job: Job, ctx: rota.Context) -> Any:
    # The spawns are called in order and awaited the other way round: each
    # default name is the spawn's place among the calls, whichever thread
    # makes its child first.
    made = [ctx.spawn("double", {"n": n}) for n in range(3)]
    ids = [await spawn for spawn in reversed(made)][::-1]
    return await ctx.gather(ids)


def test_an_async_spawn_is_named_by_its_call_not_by_when_it_is_awaited(conn, db_url) -> None:
    parent = rota.enqueue(conn, "spawns.awaited.backwards")
    backwards = handlers(spawns_awaited_backwards=spawns_awaited_backwards, double=double)
    with running(db_url, backwards, concurrency=2):
        done = until_status(conn, parent, "done", "failed", "dead")
    # Resumed after its gather, the run spawns again and must find each child
    # it made by name: the child of payload n, not another's.
    assert done["result"] == [0, 2, 4], done["last_error"]
    children = conn.execute(
        "SELECT c.name, j.payload FROM rota.job_child c JOIN rota.job j ON j.id = c.child_id"
        " WHERE c.parent_id = %s ORDER BY c.name",
        (parent,),
    ).fetchall()
    assert [(c["name"], c["payload"]["n"]) for c in children] == [("1", 0), ("2", 1), ("3", 2)]


def spawns_a_prioritized_child(job: Job, ctx: rota.Context) -> Any:
    return [ctx.spawn("prioritized"), ctx.spawn("prioritized", name="urgent", priority=1)]


def test_a_child_takes_its_handlers_priority_unless_it_names_one(
    conn, db_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As rota.enqueue does in a process that registered the child's handler.
    monkeypatch.setattr("rota.handlers._registry", {})
    rota.handler("prioritized", priority=5)(lambda job: None)
    parent = rota.enqueue(conn, "spawns.a.prioritized.child")
    spawner = handlers(spawns_a_prioritized_child=spawns_a_prioritized_child)
    with running(db_url, spawner, concurrency=1):
        done = until_status(conn, parent, "done", "failed", "dead")
    assert done["status"] == "done", done["last_error"]
    assert [row(conn, child)["priority"] for child in done["result"]] == [5, 1]


def spawns_in_a_step_then_outside(job: Job, ctx: rota.Context) -> Any:
    helper = ctx.step("prepare", lambda: ctx.spawn("double", {"n": 1}))
    main = ctx.spawn("double", {"n": 10})
    return {"main": ctx.gather([main]), "helper": helper}


def test_a_spawn_inside_a_step_leaves_the_default_names_outside_as_they_are(conn, db_url) -> None:
    # The spawn inside the step took the run's name "1": on the run after the
    # gather the step answered from storage, the spawn after it was named "1"
    # and found the step's child, and the parent gathered its result (2).
    parent = rota.enqueue(conn, "spawns.in.a.step.then.outside")
    spawner = handlers(spawns_in_a_step_then_outside=spawns_in_a_step_then_outside, double=double)
    with running(db_url, spawner, concurrency=2):
        done = until_status(conn, parent, "done", "failed", "dead")
    assert done["result"]["main"] == [20], done["last_error"]
    children = conn.execute(
        "SELECT c.name, j.payload FROM rota.job_child c JOIN rota.job j ON j.id = c.child_id"
        " WHERE c.parent_id = %s ORDER BY c.name",
        (parent,),
    ).fetchall()
    assert [(c["name"], c["payload"]["n"]) for c in children] == [("1", 10), ("prepare/1", 1)]
