"""The console's job page shows a durable job's step timeline, waits, children and parent."""

from __future__ import annotations

import re
from typing import Any

import rota
from rota.jobs import Job
from tests.durable.helpers import handlers, running, until_status
from tests.web.conftest import BEARER, make_client


def books(job: Job, ctx: rota.Context) -> Any:
    ctx.step("reserve", lambda: {"sku": "A-1", "note": "x" * 300})
    ctx.step("charge", lambda: None)
    ctx.spawn("label", {"parcel": 1}, name="label", delay=3600)
    return ctx.wait_for("warehouse:shipped")


def test_the_job_page_has_a_step_timeline_and_links_parent_and_children(conn, db_url) -> None:
    job_id = rota.enqueue(conn, "books")
    with running(db_url, handlers(books=books), concurrency=1):
        until_status(conn, job_id, "waiting")
    child = conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (job_id,)).fetchone()
    with make_client(db_url) as client:
        page = client.get(f"/jobs/{job_id}", headers=BEARER).text
        child_page = client.get(f"/jobs/{child['id']}", headers=BEARER).text
        plain = client.get(f"/jobs/{child['id'] + 1000}", headers=BEARER)
    steps = page.split('id="steps"', 1)[1].split("</table>", 1)[0]
    assert [m for m in re.findall(r"<tr><td>([^<]+)</td>", steps)] == ["reserve", "charge"]
    assert "bytes</summary>" in steps and ">null<" in steps
    assert "event <code>warehouse:shipped</code>" in page
    assert f'<a href="/jobs/{child["id"]}">{child["id"]}</a>' in page
    assert f'Spawned by <a href="/jobs/{job_id}">job {job_id}</a>' in child_page
    assert 'id="steps"' not in child_page  # a child without steps shows none
    assert plain.status_code == 404
