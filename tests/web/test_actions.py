"""Every action of the console: the change it makes and the audit row it writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from psycopg.types.json import Jsonb

from rota import schedule_store
from tests.web.conftest import BEARER, add_job, audit_rows, csrf_of

JSON = {**BEARER, "Accept": "application/json"}


def status_of(conn, job_id):
    return conn.execute("SELECT status FROM rota.job WHERE id = %s", [job_id]).fetchone()["status"]


def test_retry_a_dead_job_makes_it_ready_and_is_audited(client, conn):
    job_id = add_job(conn, "email", "dead", attempts=3, max_attempts=3)
    response = client.post(f"/jobs/{job_id}/retry", headers=JSON)
    assert response.json() == {
        "action": "retry",
        "rows": 1,
        "message": f"job {job_id} is ready again",
    }
    assert status_of(conn, job_id) == "ready"
    [row] = audit_rows(conn)
    assert (row["actor"], row["role"], row["action"], row["target"], row["rows"]) == (
        "token", "operator", "retry", {"ids": [job_id]}, 1,
    )  # fmt: skip


def test_cancel_ends_a_ready_job_and_asks_a_running_one_to_stop(client, conn):
    ready = add_job(conn, "email", "ready")
    running = add_job(conn, "email", "running", locked_by="w", locked_until=datetime.now(UTC))
    client.post(f"/jobs/{ready}/cancel", headers=JSON)
    client.post(f"/jobs/{running}/cancel", headers=JSON)
    assert status_of(conn, ready) == "cancelled"
    row = conn.execute("SELECT status, cancel_requested_at FROM rota.job WHERE id = %s", [running])
    found = row.fetchone()
    assert found["status"] == "running" and found["cancel_requested_at"] is not None
    assert [r["action"] for r in audit_rows(conn)] == ["cancel", "cancel"]


def test_a_waiting_durable_job_is_cancelled_from_its_page(client, conn):
    job_id = add_job(conn, "order", "waiting", run_at=datetime.now(UTC) + timedelta(hours=1))
    page = client.get(f"/jobs/{job_id}", headers={**BEARER, "Accept": "text/html"})
    assert f"/jobs/{job_id}/cancel" in page.text
    response = client.post(f"/jobs/{job_id}/cancel", headers=JSON)
    assert response.status_code == 200, response.text
    assert status_of(conn, job_id) == "cancelled"
    assert [r["action"] for r in audit_rows(conn)] == ["cancel"]


def test_bulk_cancel_takes_waiting_durable_jobs_too(client, conn):
    waiting = [add_job(conn, "order", "waiting") for _ in range(2)]
    done = add_job(conn, "order", "done")
    response = client.post("/jobs/bulk", data={"action": "cancel", "type": "order"}, headers=JSON)
    assert response.json()["rows"] == 2
    assert [status_of(conn, i) for i in waiting] == ["cancelled"] * 2
    assert status_of(conn, done) == "done"


def test_run_now_and_priority_change_a_delayed_ready_job(client, conn):
    job_id = add_job(conn, "email", "ready", run_at=datetime.now(UTC) + timedelta(hours=2))
    assert client.post(f"/jobs/{job_id}/run-now", headers=JSON).json()["rows"] == 1
    assert (
        client.post(f"/jobs/{job_id}/priority", data={"priority": "7"}, headers=JSON).json()["rows"]
        == 1
    )
    row = conn.execute(
        "SELECT run_at <= now() AS due, priority FROM rota.job WHERE id = %s", [job_id]
    )
    assert row.fetchone() == {"due": True, "priority": 7}
    assert [r["action"] for r in audit_rows(conn)] == ["run-now", "priority"]


def test_bulk_retry_counts_confirms_and_retries_everything_the_filter_matches(client, conn):
    mine = [add_job(conn, "email", "dead", payload=Jsonb({"shop": 1})) for _ in range(3)]
    other = add_job(conn, "email", "dead", payload=Jsonb({"shop": 2}))
    done = add_job(conn, "email", "done", payload=Jsonb({"shop": 1}))
    confirm = client.get(
        "/jobs/bulk", params={"action": "retry", "payload": "shop=1"}, headers=BEARER
    )
    assert "<strong>3</strong> job(s) will be retried" in confirm.text
    response = client.post(
        "/jobs/bulk", data={"action": "retry", "payload": "shop=1"}, headers=JSON
    )
    assert response.json()["rows"] == 3
    assert [status_of(conn, i) for i in mine] == ["ready"] * 3
    assert (status_of(conn, other), status_of(conn, done)) == ("dead", "done")
    [row] = audit_rows(conn)
    assert row["action"] == "bulk-retry" and row["rows"] == 3
    assert row["target"]["filter"] == {"payload": "shop=1"}


def test_bulk_cancel_and_bulk_priority(client, conn):
    ready = [add_job(conn, "sms", "ready") for _ in range(2)]
    client.post(
        "/jobs/bulk", data={"action": "priority", "type": "sms", "priority": "9"}, headers=JSON
    )
    assert {r["priority"] for r in conn.execute("SELECT priority FROM rota.job")} == {9}
    client.post("/jobs/bulk", data={"action": "cancel", "type": "sms"}, headers=JSON)
    assert [status_of(conn, i) for i in ready] == ["cancelled"] * 2


def test_retry_a_dead_letter_group(client, conn):
    group = [add_job(conn, "email", "dead", last_error="SMTPError: later") for _ in range(2)]
    other = add_job(conn, "email", "dead", last_error="ValueError: bad")
    response = client.post(
        "/dead/retry", data={"type": "email", "error_class": "SMTPError"}, headers=JSON
    )
    assert response.json()["rows"] == 2
    assert [status_of(conn, i) for i in group] == ["ready", "ready"]
    assert status_of(conn, other) == "dead"


def test_pause_and_resume_types_and_everything(client, conn):
    client.post("/types/pause", data={"type": "email"}, headers=JSON)
    client.post("/types/pause", data={"all": "1"}, headers=JSON)
    paused = {r["type"] for r in conn.execute("SELECT type FROM rota.paused_type")}
    assert paused == {"email", "*"}
    client.post("/types/resume", data={"all": "1"}, headers=JSON)
    assert conn.execute("SELECT count(*) AS n FROM rota.paused_type").fetchone()["n"] == 0
    assert [r["action"] for r in audit_rows(conn)] == ["pause", "pause", "resume"]


def test_suspend_and_resume_a_schedule(client, conn):
    schedule_store.upsert(conn, schedule_store.ScheduleSpec("s", "report", "* * * * *"))
    client.post("/schedules/suspend", data={"name": "s"}, headers=JSON)
    assert schedule_store.get(conn, "s")["suspend"] is True
    client.post("/schedules/resume", data={"name": "s"}, headers=JSON)
    assert schedule_store.get(conn, "s")["suspend"] is False


def test_a_browser_session_acts_with_its_csrf_value_and_returns_to_the_page(operator, conn):
    job_id = add_job(conn, "email", "dead")
    csrf = csrf_of(operator, f"/jobs/{job_id}")
    response = operator.post(
        f"/jobs/{job_id}/retry",
        data={"csrf": csrf, "next": f"/jobs/{job_id}"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    assert response.headers["location"] == f"/jobs/{job_id}"
    assert status_of(conn, job_id) == "ready"
    assert audit_rows(conn)[0]["actor"] == "token"


def test_next_never_leads_to_another_site(operator, conn):
    job_id = add_job(conn, "email", "dead")
    csrf = csrf_of(operator, f"/jobs/{job_id}")
    response = operator.post(
        f"/jobs/{job_id}/retry", data={"csrf": csrf, "next": "//evil.example/x"},
        follow_redirects=False,
    )  # fmt: skip
    assert response.headers["location"] == "/"


def test_set_and_clear_a_limit_audited(client, conn):
    response = client.post(
        "/types/limit",
        data={"type": "payment", "concurrency": "5", "rate": "100", "per": "60"},
        headers=JSON,
    )
    assert response.json() == {
        "action": "set-limit",
        "rows": 1,
        "message": "payment: concurrency 5, 100 per 60s",
    }
    row = conn.execute("SELECT concurrency, rate, per_seconds FROM rota.job_limit").fetchone()
    assert row == {"concurrency": 5, "rate": 100, "per_seconds": 60.0}
    assert "concurrency 5, 100 per 60s" in client.get("/types", headers=BEARER).text
    client.post("/types/limit/clear", data={"type": "payment"}, headers=JSON)
    assert conn.execute("SELECT count(*) AS n FROM rota.job_limit").fetchone()["n"] == 0
    [first, second] = audit_rows(conn)
    assert (first["action"], first["target"]) == (
        "set-limit",
        {"type": "payment", "concurrency": 5, "group_concurrency": None, "rate": 100, "per": 60.0},
    )
    assert (second["action"], second["target"], second["rows"]) == (
        "clear-limit",
        {"type": "payment"},
        1,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "payment"},
        {"type": "payment", "concurrency": "0"},
        {"type": "payment", "concurrency": "five"},
        {"type": "payment", "rate": "5"},
        {"type": "payment", "rate": "5", "per": "soon"},
        {"concurrency": "5"},
    ],
)
def test_a_bad_limit_is_refused_and_nothing_is_written(client, conn, fields):
    response = client.post("/types/limit", data=fields, headers=JSON)
    assert response.status_code == 400
    assert conn.execute("SELECT count(*) AS n FROM rota.job_limit").fetchone()["n"] == 0
    assert audit_rows(conn) == []


def test_actions_and_filters_take_a_name_as_it_is_white_space_and_all(client, conn):
    # Job types and schedule names may start or end with a space (every door
    # takes a name as given): the console acts on the name it showed, not on
    # another with the spaces taken off.
    spaced = add_job(conn, " email", "dead", last_error="ValueError: boom")
    plain = add_job(conn, "email", "dead", last_error="ValueError: boom")
    response = client.post(
        "/dead/retry", data={"type": " email", "error_class": "ValueError"}, headers=JSON
    )
    assert response.json()["rows"] == 1
    assert (status_of(conn, spaced), status_of(conn, plain)) == ("ready", "dead")

    client.post("/types/pause", data={"type": " email"}, headers=JSON)
    assert [r["type"] for r in conn.execute("SELECT type FROM rota.paused_type")] == [" email"]

    page = client.get("/jobs", params={"type": " email", "status": "ready"}, headers=BEARER).text
    assert f"/jobs/{spaced}" in page and f"/jobs/{plain}" not in page

    for name in ("s1", " s1"):
        schedule_store.upsert(conn, schedule_store.ScheduleSpec(name, "report", "* * * * *"))
    client.post("/schedules/suspend", data={"name": " s1"}, headers=JSON)
    assert schedule_store.get(conn, " s1")["suspend"] is True
    assert schedule_store.get(conn, "s1")["suspend"] is False


def test_a_dead_letter_group_of_any_error_class_can_be_retried(client, conn):
    # The group's class is what the table's last_error starts with, however long.
    long_class = "E" * 600
    job_id = add_job(conn, "email", "dead", last_error=f"{long_class}: boom")
    page = client.get("/dead", headers=BEARER).text
    assert f'name="error_class:json" value="&#34;{long_class}&#34;"' in page
    response = client.post(
        "/dead/retry", data={"type": "email", "error_class": long_class}, headers=JSON
    )
    assert response.json()["rows"] == 1
    assert status_of(conn, job_id) == "ready"


def test_a_schedule_whose_name_holds_a_newline_can_be_run_now(client, conn):
    schedule_store.upsert(
        conn, schedule_store.ScheduleSpec("nightly\nreport", "report", "0 3 * * *")
    )
    assert (
        'action="/schedules/nightly%0Areport/run"' in client.get("/schedules", headers=BEARER).text
    )
    response = client.post("/schedules/nightly%0Areport/run", headers=JSON)
    assert response.status_code == 200, response.text
    [job] = conn.execute("SELECT type FROM rota.job").fetchall()
    assert job["type"] == "report"
