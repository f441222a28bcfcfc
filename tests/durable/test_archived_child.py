"""An archived child keeps the job that spawned it: `rota jobs show`, the
console's job page and `rota.durable.trail` name its parent once the archiver
has moved it, as before."""

from __future__ import annotations

from typing import Any

import psycopg

import rota
from rota import durable
from rota.archive import Archiver, ArchiveSettings
from rota.cli import main
from tests.archived_rows import archive_as_before_the_check
from tests.durable.helpers import handlers, running, until_status
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
