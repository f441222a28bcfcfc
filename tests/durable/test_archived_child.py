"""An archived child keeps the job that spawned it: `rota jobs show`, the
console's job page and `rota.durable.trail` name its parent once the archiver
has moved it, as before; and the archive keeps it while its parent has not
ended, for the parent reads it on every run."""

from __future__ import annotations

from typing import Any

import psycopg

import rota
from rota import durable
from rota.archive import Archiver, ArchiveSettings
from rota.cli import main
from tests.acceptance.procs import wait_for
from tests.archived_rows import archive_as_before_the_check
from tests.durable.helpers import handlers, later, row, running, until_status
from tests.web.conftest import BEARER, make_client


def archived_child(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    parent = rota.enqueue(conn, "report", {})
    child = rota.enqueue(conn, "report.page", {"page": 1})
    conn.execute(
        "UPDATE rota.job SET status = 'done', attempts = 1, parent_id = %s,"
        " finished_at = now() - interval '30 days' WHERE id = %s",
        (parent, child),
    )
    Archiver(ArchiveSettings(done_retention_seconds=60)).run_once(conn)
    moved = conn.execute("SELECT id, parent_id FROM rota.job_archive").fetchall()
    assert moved == [{"id": child, "parent_id": parent}]
    return parent, child


def test_an_archived_child_names_its_parent(conn, db_url, monkeypatch, capsys) -> None:
    parent, child = archived_child(conn)
    assert durable.trail(conn, child).parent_id == parent
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["jobs", "show", str(child)]) == 0
    shown = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["parent_id", str(parent)] in shown
    with make_client(db_url) as client:
        page = client.get(f"/jobs/{child}", headers={**BEARER, "Accept": "text/html"}).text
    assert f'Spawned by <a href="/jobs/{parent}">job {parent}</a>' in page


def gathers_a_late_child(job: Any, ctx: rota.Context) -> Any:
    child = ctx.spawn("report.page", {"page": 1}, delay=3600)
    try:
        return ctx.gather([child])
    except rota.ChildFailed as failed:
        return {"child": failed.child_id, "status": failed.status}


def test_a_child_archived_in_a_status_no_reader_knows_has_ended(conn, db_url) -> None:
    # The database holds a child ended once it is out of rota.job; the gather
    # took only the statuses it knows as ended, so it opened its wait again and
    # again, for ever, without suspending.
    found = handlers(gathers_a_late_child=gathers_a_late_child)
    parent = rota.enqueue(conn, "gathers.a.late.child", {})
    with running(db_url, found, concurrency=1):
        until_status(conn, parent, "waiting")
    [child] = [
        r["id"] for r in conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (parent,))
    ]
    archive_as_before_the_check(conn, "sleeping", [child])
    conn.execute("UPDATE rota.job SET status = 'ready', run_at = now() WHERE id = %s", (parent,))
    with running(db_url, found, concurrency=1):
        done = until_status(conn, parent, "done")
    assert done["result"] == {"child": child, "status": "sleeping"}


def gathers_then_sleeps(job: Any, ctx: rota.Context) -> Any:
    ids = [ctx.spawn("report.page", {"page": page}) for page in (1, 2)]
    pages = ctx.gather(ids)
    ctx.sleep(60)
    return pages


def page(job: Any, ctx: rota.Context) -> Any:
    return job.payload["page"] * 10


def test_an_archive_retention_keeps_the_children_of_a_parent_that_has_not_ended(
    conn, db_url
) -> None:
    # A parent reads its children's outcomes on every run, from the archive once
    # they are archived; the archive's retention deleted them, and the parent's
    # next run failed with "job N is not a child of job M".
    found = handlers(gathers_then_sleeps=gathers_then_sleeps, report_page=page)
    parent = rota.enqueue(conn, "gathers.then.sleeps", {})
    with running(db_url, found, concurrency=2):
        wait_for(lambda: asleep(conn, parent), what=f"job {parent} asleep after its gather")
    kept = ArchiveSettings(done_retention_seconds=0, archive_retention_seconds=0)
    for seconds in (10, 20):  # archived, then past the archive's retention
        Archiver(kept).run_once(conn, now=later(conn, seconds))
    archived = "SELECT id FROM rota.job_archive WHERE parent_id = %s"
    assert len(conn.execute(archived, (parent,)).fetchall()) == 2
    with running(db_url, found, concurrency=1):
        assert durable.wake_due(db_url, now=later(conn, 61)) == [parent]
        done = until_status(conn, parent, "done", "failed")
    assert (done["status"], done["result"]) == ("done", [10, 20]), done["last_error"]
    # Once the parent has ended, its children go as any archived row.
    for seconds in (10, 20):
        Archiver(kept).run_once(conn, now=later(conn, seconds))
    assert conn.execute(archived, (parent,)).fetchall() == []


def asleep(conn: Any, job_id: int) -> bool:
    """The job waits on its first sleep."""
    sleep = "SELECT 1 FROM rota.job_wait WHERE job_id = %s AND name = 'sleep:1'"
    waiting = row(conn, job_id)["status"] == "waiting"
    return waiting and conn.execute(sleep, (job_id,)).fetchone() is not None
