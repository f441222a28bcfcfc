"""The console's job page shows a durable job's step timeline, waits, children and parent."""

from __future__ import annotations

import re
from typing import Any

from psycopg.types.json import Jsonb

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


def test_the_job_page_shows_the_last_steps_waits_and_errors_and_the_first_children(
    conn, db_url
) -> None:
    # A fan-out of thousands, a loop of steps, an errors array written by hand:
    # the page stays the size of what a person reads, and says what it left out.
    parent = rota.enqueue(conn, "fan")
    conn.execute(
        "UPDATE rota.job SET status = 'waiting', errors = %s WHERE id = %s",
        (Jsonb([{"attempt": n, "at": None, "error": f"E{n}"} for n in range(1, 51)]), parent),
    )
    conn.execute(
        "INSERT INTO rota.job (type, parent_id) SELECT 'leaf', %s FROM generate_series(1, 250)",
        (parent,),
    )
    conn.execute(
        "INSERT INTO rota.job_child (parent_id, name, child_id)"
        " SELECT parent_id, row_number() OVER (ORDER BY id), id FROM rota.job WHERE parent_id = %s",
        (parent,),
    )
    conn.execute(
        "INSERT INTO rota.job_step (job_id, name, attempt, started_at, finished_at)"
        " SELECT %s, 's' || n, 1, now() + n * interval '1 s', now() + n * interval '1 s'"
        " FROM generate_series(1, 250) AS n",
        (parent,),
    )
    conn.execute(
        "INSERT INTO rota.job_wait (job_id, name, kind, started_at, ended_at, ended_by)"
        " SELECT %s, 'sleep:' || n, 'sleep', now() + n * interval '1 s', now(), 'time'"
        " FROM generate_series(1, 250) AS n",
        (parent,),
    )
    with make_client(db_url) as client:
        page = client.get(f"/jobs/{parent}", headers=BEARER).text

    def rows(table: str) -> list[str]:
        body = page.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
        return re.findall(r"<tr><td>([^<]+)</td>", body)

    assert rows("steps") == [f"s{n}" for n in range(51, 251)]
    assert "the first 50 steps are left out" in page
    assert rows("waits") == [f"sleep:{n}" for n in range(51, 251)]
    assert "the first 50 waits are left out" in page
    assert rows("children") == [str(n) for n in range(1, 201)]
    assert "and 50 more children" in page
    assert "E31" in page and "E30" not in page  # the last 20 errors
