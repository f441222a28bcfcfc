"""Acting precisely and seeing at a glance: ticked jobs, running jobs' workers and
leases, every attempt's error and the result, a schedule run now and its recent
jobs, live lists, known types, the overview's warnings."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from psycopg.types.json import Jsonb

from rota import schedule_store, workers
from rota.scheduler import Scheduler
from rota.web import AuthSettings, actions, auth
from tests.web.conftest import BEARER, HTML, add_job, audit_rows, make_client

JSON = {**BEARER, "Accept": "application/json"}
PAGE = {**BEARER, **HTML}
OPERATOR = auth.Identity("ann", auth.OPERATOR, "token")


def statuses(conn, ids):
    rows = conn.execute("SELECT id, status FROM rota.job WHERE id = ANY(%s)", [ids]).fetchall()
    return {r["id"]: r["status"] for r in rows}


def test_an_action_on_ticked_jobs_changes_those_it_applies_to_and_is_audited(client, conn):
    dead = [add_job(conn, "email", "dead") for _ in range(2)]
    done = add_job(conn, "email", "done")
    other = add_job(conn, "email", "dead")  # not ticked
    response = client.post(
        "/jobs/selected", data={"action": "retry", "id": [*map(str, dead), str(done)]}, headers=JSON
    )
    assert response.status_code == 200, response.text
    assert (
        response.json()["message"]
        == "2 of 3 job(s) retried; 1 not dead, failed, cancelled, left as they are"
    )
    assert statuses(conn, [*dead, done, other]) == {
        dead[0]: "ready",
        dead[1]: "ready",
        done: "done",
        other: "dead",
    }
    [row] = audit_rows(conn)
    assert row["action"] == "selected-retry" and row["target"]["ids"] == sorted([*dead, done])
    assert row["rows"] == 2


def test_ticked_jobs_page_carries_boxes_and_both_kinds_of_action(client, conn):
    job_id = add_job(conn, "email", "dead")
    page = client.get("/jobs", headers=PAGE).text
    assert f'name="id" value="{job_id}" form="selection"' in page
    assert 'action="/jobs/selected"' in page and "On everything this filter matches" in page
    assert "data-tick-all" in page


def test_bad_selections_are_400_and_write_nothing(client, conn):
    job_id = add_job(conn, "email", "dead")
    for data in (
        {"action": "retry"},
        {"action": "retry", "id": "x"},
        {"action": "explode", "id": str(job_id)},
        {"action": "retry", "id": [str(i) for i in range(1, 300)]},
        {"action": "priority", "id": str(job_id)},
    ):
        assert client.post("/jobs/selected", data=data, headers=JSON).status_code == 400, data
    assert audit_rows(conn) == []


def test_running_jobs_show_their_worker_elapsed_time_and_lease_left(client, conn):
    now = datetime.now(UTC)
    job_id = add_job(
        conn, "report", "running", locked_by="worker-a1", attempts=1,
        started_at=now - timedelta(minutes=3), locked_until=now + timedelta(seconds=40),
    )  # fmt: skip
    for path in ("/jobs?status=running", f"/jobs/{job_id}"):
        text = re.sub(r"\s+", " ", client.get(path, headers=PAGE).text)
        assert re.search(r"worker-a1 · ran 3m0\ds · lease [34]\ds left", text), path
    expired = add_job(
        conn, "report", "running", locked_by="worker-b", started_at=now,
        locked_until=now - timedelta(seconds=5),
    )  # fmt: skip
    assert "expired" in client.get(f"/jobs/{expired}", headers=PAGE).text


def test_a_jobs_page_shows_every_attempts_error_and_its_result(client, conn):
    errors = [
        {"attempt": 1, "at": "2030-03-14T15:00:00+00:00", "error": "TimeoutError: first\n  File a"},
        {"attempt": 2, "at": "2030-03-14T15:01:00+00:00", "error": "ValueError: second"},
    ]
    failed = add_job(conn, "email", "dead", errors=Jsonb(errors), last_error="ValueError: second")
    page = client.get(f"/jobs/{failed}", headers=PAGE).text
    assert "TimeoutError: first" in page and "ValueError: second" in page
    assert page.index("ValueError: second", page.index('id="attempt-errors"')) < page.index(
        "TimeoutError: first", page.index('id="attempt-errors"')
    )  # newest first
    done = add_job(conn, "email", "done", result=Jsonb({"sent": 3}))
    page = client.get(f"/jobs/{done}", headers=PAGE).text
    assert 'id="result"' in page and "&#34;sent&#34;: 3" in page


def test_run_a_schedule_now_is_audited_and_shown_among_its_recent_jobs(client, conn):
    spec = schedule_store.ScheduleSpec(
        "nightly", "report", "30 2 * * *", "America/New_York", payload={"kind": "daily"}
    )
    schedule_store.upsert(conn, spec)
    response = client.post("/schedules/nightly/run", headers=JSON)
    assert response.status_code == 200, response.text
    job = conn.execute("SELECT * FROM rota.job").fetchone()
    assert (job["type"], job["payload"], job["status"]) == ("report", {"kind": "daily"}, "ready")
    assert job["schedule_id"] == schedule_store.get(conn, "nightly")["id"]
    [row] = audit_rows(conn)
    assert (row["action"], row["target"]) == (
        "run-schedule",
        {"schedule": "nightly", "ids": [job["id"]]},
    )
    page = client.get("/schedules", headers=PAGE).text
    assert f'href="/jobs/{job["id"]}"' in page
    assert 'action="/schedules/nightly/run"' in page
    assert " EST" in page or " EDT" in page  # the schedule's own zone
    assert client.post("/schedules/nope/run", headers=JSON).status_code == 404


def test_a_schedule_run_now_makes_the_job_its_slots_make(client, conn):
    # Its group too: a job outside the group would not count against the
    # group's limit (a tenant's concurrency of 1 would run two at once).
    spec = schedule_store.ScheduleSpec(
        "tenant-sync", "sync", "*/5 * * * *", payload={"tenant": 7}, priority=3,
        timeout_seconds=45.0, group="tenant-7", max_attempts=4,
    )  # fmt: skip
    schedule_store.upsert(conn, spec)
    assert client.post("/schedules/tenant-sync/run", headers=JSON).status_code == 200
    job = conn.execute("SELECT * FROM rota.job").fetchone()
    assert (job["type"], job["payload"], job["group_key"]) == ("sync", {"tenant": 7}, "tenant-7")
    assert (job["priority"], job["timeout_seconds"], job["max_attempts"]) == (3, 45.0, 4)


def _slot_job(conn, name, slot):
    """The scheduler's tick just after `slot`, the schedule's next slot."""
    conn.execute("UPDATE rota.schedule SET next_run_at = %s WHERE name = %s", [slot, name])
    return Scheduler().run_once(conn, now=slot + timedelta(seconds=1))


def test_run_now_of_a_unique_active_schedule_waits_for_its_active_job(client, conn):
    spec = schedule_store.ScheduleSpec("sync", "sync", "*/5 * * * *", unique_active=True)
    schedule_store.upsert(conn, spec)
    slot = datetime(2030, 3, 14, 10, 0, tzinfo=UTC)
    assert _slot_job(conn, "sync", slot).enqueued == 1
    response = client.post("/schedules/sync/run", headers=JSON)
    assert response.status_code == 409, response.text
    assert "unique_active" in response.json()["error"]
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 1
    assert audit_rows(conn) == []
    conn.execute("UPDATE rota.job SET status = 'done', finished_at = now()")
    assert client.post("/schedules/sync/run", headers=JSON).status_code == 200
    # The run-now job holds the schedule's key: the next slot is skipped.
    result = _slot_job(conn, "sync", slot + timedelta(minutes=5))
    assert (result.enqueued, result.skipped) == (0, 1)
    key = schedule_store.unique_key(schedule_store.get(conn, "sync")["id"])
    active = conn.execute("SELECT unique_key FROM rota.job WHERE status = 'ready'").fetchall()
    assert active == [{"unique_key": key}]


def test_run_now_of_a_unique_for_schedule_takes_the_window_of_its_moment(conn):
    spec = schedule_store.ScheduleSpec(
        "refresh", "refresh", "*/15 * * * *", unique_for_seconds=3600
    )
    schedule_store.upsert(conn, spec)
    slot = datetime(2030, 3, 14, 10, 0, tzinfo=UTC)
    assert _slot_job(conn, "refresh", slot).enqueued == 1
    with pytest.raises(actions.Conflict, match="11:00:00"):
        actions.run_schedule(conn, OPERATOR, "refresh", now=slot + timedelta(minutes=20))
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 1
    asked = slot + timedelta(minutes=65)  # the window passed
    done = actions.run_schedule(conn, OPERATOR, "refresh", now=asked)
    assert done.rows == 1
    # Its window opens at the moment asked: the slots of the next hour make no job.
    assert _slot_job(conn, "refresh", slot + timedelta(minutes=75)).skipped == 1
    assert _slot_job(conn, "refresh", slot + timedelta(minutes=120)).skipped == 1
    assert _slot_job(conn, "refresh", slot + timedelta(minutes=135)).enqueued == 1


def test_a_viewer_cannot_run_a_schedule(db_url, conn):
    schedule_store.upsert(conn, schedule_store.ScheduleSpec("s", "report", "* * * * *"))
    with make_client(db_url, auth=AuthSettings()) as c:
        assert c.post("/schedules/s/run").status_code == 403
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 0


def test_every_list_refreshes_itself(client, conn):
    for path in ("/", "/jobs", "/dead", "/schedules", "/types", "/workers", "/audit"):
        page = client.get(path, headers=PAGE).text
        assert re.search(r'hx-trigger="every 5s"[^>]*data-live', page), path
    assert 'id="live-toggle"' in page


def test_the_type_filter_offers_the_known_types(client, conn):
    add_job(conn, "email", "done")
    conn.execute("INSERT INTO rota.paused_type (type) VALUES ('sms')")
    workers.register(conn, workers.WorkerInfo("w1", concurrency=1, types=("invoice",)))
    page = client.get("/jobs", headers=PAGE).text
    datalist = page[page.index('<datalist id="known-types">') :].split("</datalist>")[0]
    offered = re.findall(r'option value="([^"]+)"', datalist)
    assert offered == ["email", "invoice", "rota.archive", "sms"]  # rota.archive: its schedule


def test_a_type_with_no_worker_is_not_called_claimed(client, conn):
    add_job(conn, "email", "ready")
    page = client.get("/types", headers=PAGE).text
    row = page[page.index('data-type="email"') :].split("</tr>")[0]
    assert "no live worker" in row and "claimed" not in row
    workers.register(conn, workers.WorkerInfo("w1", concurrency=1, types=("email",)))
    row = client.get("/types", headers=PAGE).text.split('data-type="email"')[1].split("</tr>")[0]
    assert "claimed by workers" in row and "1 listing it" in row


def test_the_overview_warns_of_what_needs_a_person(client, conn):
    add_job(conn, "email", "ready")
    add_job(conn, "email", "failed")
    conn.execute("INSERT INTO rota.paused_type (type) VALUES ('sms')")
    conn.execute(
        "INSERT INTO rota.lease_expiration (hour, count) VALUES (date_trunc('hour', now()), 2)"
    )
    page = client.get("/", headers=PAGE).text
    strip = page[page.index('id="warnings"') :].split("</ul>")[0]
    assert "1 due email job(s) and no live worker serves email" in strip
    assert "paused: sms" in strip
    assert "2 lease(s) expired this hour" in strip
    assert re.search(r'class="count bad" href="/jobs\?status=failed&amp;type=email">1<', page)
    conn.execute("DELETE FROM rota.paused_type")
    conn.execute("DELETE FROM rota.lease_expiration")
    conn.execute("DELETE FROM rota.job WHERE status = 'failed'")
    workers.register(conn, workers.WorkerInfo("w1", concurrency=1, types=("email",)))
    assert "Nothing needs you" in client.get("/", headers=PAGE).text


def test_times_are_relative_with_the_absolute_time_on_hover(client, conn):
    job_id = add_job(conn, "email", "dead", finished_at=datetime.now(UTC) - timedelta(minutes=3))
    page = client.get(f"/jobs/{job_id}", headers=PAGE).text
    assert re.search(r'<time datetime="[^"]+" title="[^"]+ UTC">3 min ago</time>', page)


def test_the_overview_shows_limits_holding_jobs_back(client, conn):
    from rota import flow

    workers.register(conn, workers.WorkerInfo("w1", concurrency=4, types=("payment",)))
    flow.set_limit(conn, "payment", concurrency=1)
    add_job(conn, "payment", "running", locked_by="w1", started_at=datetime.now(UTC))
    for _ in range(3):
        add_job(conn, "payment", "ready")
    page = client.get("/", headers=PAGE).text
    strip = page[page.index('id="warnings"') :].split("</ul>")[0]
    assert "a limit holds back 3 due payment job(s) (concurrency 1)" in strip
    assert re.search(r'class="count warn" href="/types#limit-list">limited: 3 held<', page)


def test_a_schedule_named_with_slashes_and_dots_is_run_by_its_own_name(client, conn):
    for name in ("a/b/../c", "a/c", "..", "./x"):
        schedule_store.upsert(conn, schedule_store.ScheduleSpec(name, "report", "* * * * *"))
    page = client.get("/schedules", headers=PAGE).text
    actions = re.findall(r'action="(/schedules/[^"]*/run)"', page)
    assert 'action="/schedules/a%2Fb%2F..%2Fc/run"' in page
    assert "/schedules/a/b/../c/run" not in page
    for url in actions:
        assert client.post(url, headers=JSON).status_code == 200, url
    ran = [r["target"]["schedule"] for r in audit_rows(conn)]
    assert sorted(ran) == sorted(["a/b/../c", "a/c", "..", "./x", "rota/archive"])
