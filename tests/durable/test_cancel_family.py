"""Cancelling durable jobs: a parent's children, and theirs, end with it."""

from __future__ import annotations

import pytest

import rota
from rota import control
from rota.claim import claim
from rota.durable import Run
from rota.errors import Suspended
from rota.reaper import Reaper
from tests.durable.helpers import later, row


def test_cancelling_parents_by_type_cancels_their_children_too(conn) -> None:
    # As a cancel by id does: a child of a cancelled parent is not left to run.
    waiting, running_parent, other = (rota.enqueue(conn, t) for t in ("p", "p", "q"))
    conn.execute("UPDATE rota.job SET status = 'waiting' WHERE id = %s", (waiting,))
    conn.execute(
        "UPDATE rota.job SET status = 'running', attempts = 1, locked_by = 'w',"
        " locked_until = now() + interval '1 hour' WHERE id = %s",
        (running_parent,),
    )
    child = rota.enqueue(conn, "c")
    grandchild = rota.enqueue(conn, "c")
    of_running = rota.enqueue(conn, "c")
    of_other = rota.enqueue(conn, "c")
    for kid, parent in ((child, waiting), (grandchild, child), (of_running, running_parent),
                        (of_other, other)):  # fmt: skip
        conn.execute("UPDATE rota.job SET parent_id = %s WHERE id = %s", (parent, kid))
    result = control.cancel_matching(conn, "p")
    assert result.ended == sorted([waiting, child, grandchild, of_running])
    assert result.requested == [running_parent]
    assert row(conn, of_other)["status"] == "ready"


def _waiting(conn, job_type: str, name: str, **wait: object) -> int:
    """A job waiting on one wait, as rota.suspend leaves it."""
    job_id = rota.enqueue(conn, job_type)
    conn.execute("UPDATE rota.job SET status = 'waiting' WHERE id = %s", (job_id,))
    conn.execute(
        "INSERT INTO rota.job_wait (job_id, name, kind, event_key, children, started_at)"
        " VALUES (%s, %s, %s, %s, %s, now())",
        (job_id, name, wait["kind"], wait.get("key"), wait.get("children")),
    )
    return job_id


def _ended(conn, job_id: int) -> list[tuple[str, str | None]]:
    rows = conn.execute(
        "SELECT name, ended_by FROM rota.job_wait WHERE job_id = %s", (job_id,)
    ).fetchall()
    return [(r["name"], r["ended_by"]) for r in rows]


def test_an_emit_after_a_cancel_leaves_the_cancelled_jobs_wait_as_it_was(conn) -> None:
    job_id = _waiting(conn, "p", "event:late", kind="event", key="late")
    assert control.cancel(conn, [job_id]).ended == [job_id]
    assert rota.emit(conn, "late", {"n": 1}) == 0
    # `rota jobs show` reads it "not ended: job cancelled", not ended by the event.
    assert _ended(conn, job_id) == [("event:late", None)]


def test_children_cancelled_with_their_parent_leave_its_gather_as_it_was(conn) -> None:
    child = rota.enqueue(conn, "c")
    parent = _waiting(conn, "p", "gather:1", kind="children", children=[child])
    conn.execute("UPDATE rota.job SET parent_id = %s WHERE id = %s", (parent, child))
    assert control.cancel(conn, [parent]).ended == sorted([parent, child])
    assert row(conn, child)["status"] == "cancelled"
    assert _ended(conn, parent) == [("gather:1", None)]


def test_jobs_that_change_status_while_a_cancel_by_type_runs_are_cancelled(
    conn, db_url, monkeypatch
) -> None:
    # A job running with an expired lease and one whose sleep is over: after the
    # command's first statement the reaper makes both ready. They were
    # cancellable the whole time; neither may be left to run.
    expired, sleeping = rota.enqueue(conn, "T"), rota.enqueue(conn, "T")
    claim(conn, "w", 1, 1)
    [sleeper] = claim(conn, "w", 1, 300)
    run = Run(db_url, "w", sleeper)
    with pytest.raises(Suspended):
        run.sleep(1)
    run.close()
    at = later(conn, 5)
    statements = []
    real = control.fetch_all

    def meanwhile(*args, **kwargs):
        rows = real(*args, **kwargs)
        statements.append(args[1])
        if len(statements) == 1:
            reaped = Reaper().run_once(db_url, now=at)
            assert (reaped.requeued, reaped.woken) == ([expired], [sleeping])
        return rows

    monkeypatch.setattr(control, "fetch_all", meanwhile)
    result = control.cancel_matching(conn, "T")
    assert result.ended == [expired, sleeping]
    assert [row(conn, i)["status"] for i in (expired, sleeping)] == ["cancelled", "cancelled"]
