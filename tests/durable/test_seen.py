"""Waiting jobs are seen everywhere: `rota jobs show`, `rota status`, metrics and
scaling count them apart, and unique keys hold while their job waits."""

from __future__ import annotations

import json
from typing import Any

import rota
from rota.cli import main
from rota.jobs import Job
from rota.status import queue_age, read_status
from tests.durable.helpers import handlers, later, running, until_status


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
