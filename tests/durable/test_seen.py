"""Waiting jobs are known everywhere: `rota jobs show`, `rota status`, metrics and
scaling count them apart; unique keys and limits, the archive and cancel know them."""

from __future__ import annotations

import json
from typing import Any

import rota
from rota import control
from rota.archive import Archiver
from rota.cli import main
from rota.jobs import Job, Status
from rota.status import queue_age, read_status
from tests.durable.helpers import handlers, later, running, until_status
from tests.web.conftest import BEARER, make_client


def ships(job: Job, ctx: rota.Context) -> Any:
    ctx.step("reserve", lambda: {"sku": "A-1"})
    ctx.spawn("label", {"parcel": 1}, name="label", delay=3600)
    return ctx.wait_for("warehouse:shipped", timeout=600)


HANDLERS = handlers(ships=ships)


def test_jobs_show_lists_steps_waits_and_children(conn, db_url, monkeypatch, capsys) -> None:
    job_id = rota.enqueue(conn, "ships")
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["jobs", "show", str(job_id)]) == 0
    text = capsys.readouterr().out
    assert [line.split() for line in text.splitlines() if line.startswith("status ")] == [
        ["status", "waiting"]
    ]
    steps, waits, children = (
        text.split(f"{part}:\n", 1)[1] for part in ("steps", "waits", "children")
    )
    assert steps.startswith("  reserve  attempt 1 ")
    assert waits.startswith("  event:warehouse:shipped  until ") and " open" in waits
    assert children.startswith("  label  job ") and "label  ready" in children
    assert main(["jobs", "show", str(job_id), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "waiting"
    assert [s["name"] for s in shown["steps"]] == ["reserve"]
    assert [(w["kind"], w["event_key"], w["ended_by"]) for w in shown["waits"]] == [
        ("event", "warehouse:shipped", None)
    ]
    child = shown["children"][0]["id"]
    assert main(["jobs", "show", str(child), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parent_id"] == job_id


def test_waiting_jobs_count_apart_in_status_and_scaling(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "ships")
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
    status = read_status(conn)
    assert status.types["ships"].waiting == 1
    assert (status.types["ships"].ready, status.types["ships"].running) == (0, 0)
    assert queue_age(conn, ["ships"]).ready_jobs == 0  # waiting: no worker is needed
    # Once its timeout has come, a pool scaled to zero must start a worker (whose
    # reaper makes it ready): it counts as ready for scaling.
    due = queue_age(conn, ["ships"], now=later(conn, 601))
    assert due.ready_jobs == 1 and due.oldest_ready_age_seconds > 0


def test_a_waiting_job_holds_its_unique_active_key(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "ships", key="order-9", unique_active=True)
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
    assert rota.enqueue(conn, "ships", key="order-9", unique_active=True) == job_id
    rota.cancel(conn, [job_id])
    assert rota.enqueue(conn, "ships", key="order-9", unique_active=True) != job_id


def limited(job: Job, ctx: rota.Context) -> Any:
    if job.payload.get("sleep"):
        ctx.sleep(3600)
    return "ran"


def test_a_waiting_job_frees_its_limit_slot(conn, db_url) -> None:
    rota.set_limit(conn, "limited", concurrency=1)
    sleeper = rota.enqueue(conn, "limited", {"sleep": True})
    with running(db_url, handlers(limited=limited), concurrency=2):
        until_status(conn, sleeper, "waiting")
        other = rota.enqueue(conn, "limited")
        assert until_status(conn, other, "done")["result"] == "ran"


def test_the_archive_keeps_waiting_jobs_and_forgets_old_events(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "ships")
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
    rota.emit(conn, "old-news", 1)
    done = rota.enqueue(conn, "ships")
    conn.execute(
        "UPDATE rota.job SET status = 'done', finished_at = now() - interval '8 days'"
        " WHERE id = %s",
        (done,),
    )
    conn.execute(
        "INSERT INTO rota.job_step (job_id, name, attempt, started_at, finished_at)"
        " VALUES (%s, 'a', 1, now(), now())",
        (done,),
    )
    result = Archiver().run_once(conn, now=later(conn, 31 * 86400))
    assert (result.done, result.events) == (1, 1)
    assert conn.execute("SELECT status FROM rota.job WHERE id = %s", (job_id,)).fetchone() == {
        "status": "waiting"
    }
    steps = conn.execute("SELECT job_id FROM rota.job_step ORDER BY job_id").fetchall()
    assert [s["job_id"] for s in steps] == [job_id]  # the archived job's step went with it
    assert rota.emit(conn, "old-news", 2) == 0
    assert conn.execute("SELECT payload FROM rota.job_event").fetchone() == {"payload": 2}


def test_cancel_by_type_ends_the_waiting_jobs_of_the_type(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "ships")
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
    children = [
        r["id"] for r in conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (job_id,))
    ]
    result = control.cancel_matching(conn, "ships", Status.WAITING)
    assert children and result.ended == sorted([job_id, *children])  # with its children
    assert until_status(conn, job_id, "cancelled")["last_error"] == "Cancelled: while it waited"


def test_a_cancelled_jobs_wait_is_not_shown_waiting(conn, db_url, monkeypatch, capsys) -> None:
    # A job cancelled while it waited keeps its wait's row as it was (not ended):
    # `rota jobs show` and the console say the job ended, not that it waits.
    job_id = rota.enqueue(conn, "ships")
    with running(db_url, HANDLERS, concurrency=1):
        until_status(conn, job_id, "waiting")
    rota.cancel(conn, [job_id])
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["jobs", "show", str(job_id)]) == 0
    waits = capsys.readouterr().out.split("waits:\n", 1)[1].splitlines()[0]
    assert waits.endswith("not ended: job cancelled"), waits
    with make_client(db_url) as client:
        page = client.get(f"/jobs/{job_id}", headers=BEARER).text
    ended = page.split('id="waits"', 1)[1].split("</table>", 1)[0]
    assert "not ended: job cancelled" in ended and ">waiting<" not in ended
