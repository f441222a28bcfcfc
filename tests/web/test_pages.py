"""Every page of the console against a real database, and bad input: 4xx, nothing written."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta

import pytest
from psycopg.types.json import Jsonb

from rota import schedule_store, workers
from rota.web import reads
from tests.web.conftest import BEARER, HTML, add_job, audit_rows

NOW = datetime(2030, 3, 14, 15, 30, tzinfo=UTC)


def test_overview_shows_each_type_with_its_counts_and_paused_state(client, conn):
    add_job(conn, "email", "ready")
    add_job(conn, "email", "dead", last_error="ValueError: no")
    add_job(conn, "report", "done")
    conn.execute("INSERT INTO rota.paused_type (type) VALUES ('report')")
    page = client.get("/", headers=BEARER)
    assert page.status_code == 200
    assert "email" in page.text and "report" in page.text
    assert "paused" in page.text
    assert 'hx-trigger="every 5s"' in page.text
    live = client.get("/", headers={**BEARER, "HX-Request": "true"})
    assert live.text.lstrip().startswith('<section id="live"')


def test_overview_charts_read_the_minute_samples(client, conn):
    for minute in range(5):
        workers.record_sample(conn, now=datetime.now(UTC) - timedelta(minutes=5 - minute))
    conn.execute("UPDATE rota.queue_sample SET done_total = extract(minute FROM minute)")
    page = client.get("/", headers=BEARER)
    # Throughput, failed attempts (none: a flat line at zero), the queue's age.
    assert page.text.count("<polyline") == 3


def test_jobs_filter_by_status_type_key_and_payload(client, conn):
    a = add_job(conn, "email", "ready", payload=Jsonb({"to": "a@x", "n": 1}), idempotency_key="k1")
    b = add_job(conn, "email", "dead", payload=Jsonb({"to": "b@x", "deep": {"n": 2}}))
    c = add_job(conn, "sms", "ready", payload=Jsonb({"to": "a@x"}))

    def ids(**params):
        page = client.get("/jobs", params=params, headers=BEARER)
        assert page.status_code == 200, page.text
        return {i for i in (a, b, c) if f'href="/jobs/{i}"' in page.text}

    assert ids() == {a, b, c}
    assert ids(status="dead") == {b}
    assert ids(type="email") == {a, b}
    assert ids(key="k1") == {a}
    assert ids(payload="to=a@x") == {a, c}
    assert ids(payload='{"n": 1}') == {a}
    assert ids(payload="deep.n=2") == {b}
    assert ids(payload="to=a@x", type="sms") == {c}
    assert ids(created_from="2000-01-01T00:00:00Z", created_to="2000-01-02") == set()


def test_jobs_keyset_pagination_walks_every_job_once(client, conn):
    made = [add_job(conn, "email", "done") for _ in range(7)]
    seen, before = [], None
    for _ in range(5):
        params = {"limit": "3", **({"before": str(before)} if before else {})}
        page = client.get("/jobs", params=params, headers=BEARER).text
        seen += [i for i in made if f'href="/jobs/{i}"' in page]
        if 'rel="next"' not in page:
            break
        found = re.search(r'href="/jobs\?[^"]*before=(\d+)[^"]*" rel="next"', page)
        assert found, page
        before = int(found.group(1))
    assert sorted(seen) == made


def test_job_page_shows_the_whole_row_error_effects_and_schedule(client, conn):
    spec = schedule_store.ScheduleSpec("nightly", "report", "0 3 * * *", "Europe/Berlin")
    schedule = schedule_store.upsert(conn, spec, now=NOW)
    job_id = add_job(
        conn, "report", "dead", idempotency_key="order-7", priority=3, timeout_seconds=30,
        last_error='ValueError: bad\nTraceback:\n  File "h.py", line 3', schedule_id=schedule["id"],
        slot=NOW, attempts=3, max_attempts=3,
    )  # fmt: skip
    conn.execute(
        "INSERT INTO rota.job_effect (job_key, effect, result) VALUES ('order-7', 'charged', '1')"
    )
    page = client.get(f"/jobs/{job_id}", headers=BEARER).text
    for text in ("ValueError: bad", "File &#34;h.py&#34;, line 3", "charged", "nightly", "30.0 s",
                 "3 of 3", "order-7", "Retry"):  # fmt: skip
        assert text in page, text


def test_archived_job_is_shown_read_only(client, conn):
    conn.execute(
        "INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts, max_attempts,"
        " created_at) VALUES (99, 'email', '{}', 'done', now(), 1, 3, now())"
    )
    page = client.get("/jobs/99", headers=BEARER).text
    assert "archived" in page and "Retry" not in page


def test_dead_letters_grouped_by_type_and_error_class(client, conn):
    for _ in range(3):
        add_job(conn, "email", "dead", last_error="SMTPError: 451 try later\n  File x")
    add_job(conn, "email", "dead", last_error="ValueError: bad address")
    add_job(conn, "sms", "dead", last_error="SMTPError: odd")
    page = client.get("/dead", headers=BEARER).text
    assert page.count("<tr>") == 1 + 3
    assert "SMTPError" in page and "Retry 3" in page


def test_schedules_page_shows_slots_in_zone_and_utc_and_a_dst_preview(client, conn):
    spec = schedule_store.ScheduleSpec("berlin", "report", "30 2 * * *", "Europe/Berlin")
    schedule_store.upsert(conn, spec)
    page = client.get("/schedules", headers=BEARER).text
    assert "berlin" in page and "Europe/Berlin" in page
    assert "CET" in page or "CEST" in page
    assert "change of UTC offset" in page


class _HostAhead(datetime):
    """The console host's clock, 30 minutes ahead of the database's."""

    @classmethod
    def now(cls, tz=None):  # type: ignore[override]
        return datetime.now(tz) + timedelta(minutes=30)


def test_schedules_page_reads_the_database_s_clock_not_the_host_s(client, conn, monkeypatch):
    # DESIGN.md section 1: every time comes from the database's clock. With the
    # host's clock ahead, the next slots were those after the host's time (30
    # minutes late) and "ago" was counted from it.
    for module in ("rota.web.reads", "rota.web.console"):
        monkeypatch.setattr(f"{module}.datetime", _HostAhead)
    schedule_store.upsert(conn, schedule_store.ScheduleSpec("every", "t", "*/2 * * * *"))
    conn.execute(
        "UPDATE rota.schedule SET last_slot = now() - interval '5 minutes' WHERE name = 'every'"
    )
    before = conn.execute("SELECT now() AS now").fetchone()["now"]
    page = client.get("/schedules", headers=BEARER).text
    section = page[page.index('id="schedule-every"') :]
    table = section[section.index("Next slots") :]
    shown = re.findall(r"<td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00)</td>", table)
    first = datetime.fromisoformat(shown[0])
    assert before < first <= before + timedelta(minutes=2), (before, shown)
    assert ">5 min ago</time>" in section, section  # the last slot


def test_schedules_page_shows_payloads_and_the_archivers_settings_in_words(client, conn):
    spec = schedule_store.ScheduleSpec(
        "rota/archive", "rota.archive", "*/5 * * * *", payload={"done_retention_seconds": 3600}
    )
    schedule_store.upsert(conn, spec)
    schedule_store.upsert(
        conn, schedule_store.ScheduleSpec("nightly", "report", "0 3 * * *", payload={"to": "<b>"})
    )
    page = client.get("/schedules", headers=BEARER).text
    # The payload as JSON, its text as text: never as markup, never as \u escapes.
    assert "{&#34;to&#34;: &#34;&lt;b&gt;&#34;}" in page and "<b>" not in page
    assert "<b>" not in page
    assert "done jobs to <code>rota.job_archive</code> 1h after they finish" in page
    assert "failed, dead and cancelled ones after 30d" in page
    assert "archived rows are kept" in page
    assert "Keys of <code>unique_for</code> are deleted 1h after their window has passed" in page

    spec = dataclasses.replace(spec, payload={"archive_retention_seconds": 90 * 86400})
    schedule_store.upsert(conn, spec)
    page = client.get("/schedules", headers=BEARER).text
    assert "done jobs to <code>rota.job_archive</code> 7d after" in page
    assert "archived rows are deleted 90d after they were archived" in page

    # A payload the archiver would refuse: its reason, and the slots all the same.
    for payload, reason in [
        ({"done_retention_seconds": -1}, "archive retentions must not be negative"),
        ({"done_retention_seconds": "7d"}, "done_retention_seconds must be a number of seconds"),
        ({"batch_size": 10.5}, "batch_size must be a whole number"),
    ]:
        schedule_store.upsert(conn, dataclasses.replace(spec, payload=payload))
        page = client.get("/schedules", headers=BEARER).text
        assert f"the archiver refuses this payload: {reason}" in page, reason
        assert "Next slots" in page and page.count("<td>") >= 2 * 5 * 2


def test_span_writes_a_duration_in_its_largest_whole_unit():
    seconds = (86400 * 7, 36 * 3600, 5400, 90, 45, 1.5, 0, None)
    spans = ["7d", "36h", "90m", "90s", "45s", "1.5s", "0s", "-"]
    assert [reads.span(s) for s in seconds] == spans


def test_workers_page_shows_live_workers_and_what_they_run(client, conn):
    info = workers.WorkerInfo("w-1", concurrency=4, types=("email",), host="h1", pid=42)
    workers.register(conn, info)
    job_id = add_job(conn, "email", "running", locked_by="w-1", started_at=datetime.now(UTC))
    workers.register(
        conn, workers.WorkerInfo("gone", 1), ttl=1, now=datetime.now(UTC) - timedelta(days=1)
    )
    page = client.get("/workers", headers=BEARER).text
    assert "w-1" in page and "h1 / 42" in page and f'href="/jobs/{job_id}"' in page
    assert "1 of 4" in page and "gone" not in page


def test_audit_page_lists_actions_newest_first(client, conn):
    client.post("/types/pause", data={"type": "email"}, headers=BEARER)
    client.post("/types/resume", data={"type": "email"}, headers=BEARER)
    page = client.get("/audit", headers=BEARER).text
    assert page.index("resume") < page.index("pause")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/jobs?status=zombie", "unknown status"),
        ("/jobs?payload=%7Bnot-json", "not valid JSON"),
        ("/jobs?payload=nonsense", "neither a JSON object"),
        ("/jobs?payload=%5B1%2C2%5D", "neither a JSON object"),
        ("/jobs?before=99999999999999999999999", "between 1 and"),
        ("/jobs?before=-4", "between 1 and"),
        ("/jobs?limit=100000", "limit must be"),
        ("/jobs?page=999999999999", "unknown parameter"),
        ("/jobs?created_from=yesterday", "ISO-8601"),
        ("/jobs?created_from=2030-01-02&created_to=2030-01-01", "before created_to"),
        ("/jobs/abc", "not a whole number"),
        ("/jobs/99999999999999999999", "between 1 and"),
        ("/jobs/bulk?action=explode", "unknown bulk action"),
        ("/jobs/bulk?action=retry&status=ready", "applies to"),
        ("/audit?before=0", "between 1 and"),
    ],
)
def test_bad_input_is_a_clear_400(client, conn, path, reason):
    page = client.get(path, headers=BEARER)
    assert page.status_code == 400, page.text
    assert reason in page.json()["error"]
    html = client.get(path, headers={**BEARER, **HTML})
    assert html.status_code == 400 and reason in html.text


def test_unknown_job_is_404_and_bad_actions_write_nothing(client, conn):
    assert client.get("/jobs/12345", headers=BEARER).status_code == 404
    ready = add_job(conn, "email", "ready")
    cases = [
        ("/jobs/12345/retry", {}, 404),
        (f"/jobs/{ready}/retry", {}, 409),  # ready jobs are not retried
        (f"/jobs/{ready}/priority", {"priority": "12"}, 400),
        (f"/jobs/{ready}/priority", {"priority": "x"}, 400),
        (f"/jobs/{ready}/run-now", {}, 409),  # due already
        ("/jobs/bulk", {"action": "retry", "status": "zombie"}, 400),
        ("/jobs/bulk", {"action": "priority", "status": "ready"}, 400),
        ("/types/pause", {}, 400),
        ("/types/pause", {"type": "*"}, 400),
        ("/schedules/suspend", {"name": "nope"}, 404),
        ("/dead/retry", {}, 400),
    ]
    for path, data, status in cases:
        response = client.post(path, data=data, headers=BEARER)
        assert response.status_code == status, (path, response.text)
    assert audit_rows(conn) == []
    row = conn.execute("SELECT status, priority FROM rota.job WHERE id = %s", [ready]).fetchone()
    assert row == {"status": "ready", "priority": 0}
    assert conn.execute("SELECT count(*) AS n FROM rota.paused_type").fetchone()["n"] == 0


def test_healthz_and_static_files_are_served_locally(client):
    assert client.get("/healthz").text == "ok\n"
    assert client.get("/static/htmx.min.js").status_code == 200
    assert "/static/htmx.min.js" in client.get("/", headers=BEARER).text
