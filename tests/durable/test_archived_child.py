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
