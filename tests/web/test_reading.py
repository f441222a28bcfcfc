"""The job list and the job page as a person reads them: text as text, a job
waiting for its next attempt called "retrying" and found by that name, errors
found by their text, and a job that recovered not painted as failing."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

from psycopg.types.json import Jsonb

from rota.web import filters
from tests.web.conftest import BEARER, HTML, add_job, make_client

PAGE = {**BEARER, **HTML}


def listed(client, **params) -> set[int]:
    page = client.get("/jobs", params=params, headers=PAGE)
    assert page.status_code == 200, page.text
    return {int(i) for i in re.findall(r'<td><a href="/jobs/(\d+)">', page.text)}


def test_a_payload_is_shown_as_its_text_on_the_job_page(client, conn):
    job = add_job(conn, "mail", payload=Jsonb({"to": "Müller & Söhne", "tag": "<b>"}))
    page = client.get(f"/jobs/{job}", headers=PAGE).text
    payload = page[page.index('<pre class="payload">') :].split("</pre>")[0]
    assert "\\u00fc" not in payload and "\\u0026" not in payload
    assert '"to": "Müller & Söhne"' in html.unescape(payload)
    assert "<b>" not in payload  # escaped for HTML all the same


def test_a_job_waiting_for_its_next_attempt_is_retrying_and_can_be_filtered(client, conn):
    later = datetime.now(UTC) + timedelta(minutes=5)
    fresh = add_job(conn, "mail")
    again = add_job(conn, "mail", attempts=2, run_at=later, last_error="SMTPError: 451")
    page = client.get("/jobs", headers=PAGE).text
    row = page[page.index(f'href="/jobs/{again}"') :].split("</tr>")[0]
    assert '<span class="status s-retrying">retrying</span>' in row
    assert listed(client, status="retrying") == {again}
    assert listed(client, status="ready") == {fresh, again}
    form = client.get("/jobs?status=retrying", headers=PAGE).text
    assert '<option value="retrying" selected>' in form
    assert filters.parse_filter({"status": "retrying"}).query() == "status=retrying"


def test_errors_can_be_searched_in_any_case(client, conn):
    smtp = add_job(conn, "mail", "dead", last_error="SMTPError: 451 try again\n  File x")
    add_job(conn, "mail", "dead", last_error="KeyError: 'to'")
    add_job(conn, "mail", "done")
    assert listed(client, error="smtperror") == {smtp}
    assert listed(client, error="try again", status="dead") == {smtp}
    assert listed(client, error="nothing like it") == set()


def test_a_job_done_after_a_retry_is_not_painted_red(client, conn):
    done = add_job(conn, "mail", "done", attempts=2, last_error="SMTPError: 451")
    dead = add_job(conn, "mail", "dead", attempts=2, last_error="SMTPError: 550")
    page = client.get("/jobs", headers=PAGE).text
    done_row = page[page.index(f'href="/jobs/{done}"') :].split("</tr>")[0]
    dead_row = page[page.index(f'href="/jobs/{dead}"') :].split("</tr>")[0]
    assert 'class="error"' not in done_row and "recovered from: SMTPError: 451" in done_row
    assert 'class="error"' in dead_row


def test_pages_read_whatever_styles_the_database_gives_its_sessions(db_url, conn):
    # ALTER DATABASE ... SET reaches every session the console's pool opens.
    name = conn.execute("SELECT current_database() AS d").fetchone()["d"]
    for setting in ("DateStyle = German", "IntervalStyle = iso_8601", "client_encoding = LATIN1"):
        conn.execute(f'ALTER DATABASE "{name}" SET {setting}')
    job = add_job(conn, "€uro", "dead", finished_at=datetime(2030, 1, 2, tzinfo=UTC))
    with make_client(db_url) as client:
        for path in ("/", "/jobs", f"/jobs/{job}", "/dead", "/types"):
            page = client.get(path, headers=PAGE)
            assert page.status_code == 200, (path, page.text)
        assert "€uro" in client.get(f"/jobs/{job}", headers=PAGE).text


def test_a_status_filter_is_named_as_the_command_line_names_it(client):
    # Lower case, as `rota jobs list --status` takes it: no other case, retrying included.
    for status in ("retrying", "done"):
        assert client.get("/jobs", params={"status": status}, headers=PAGE).status_code == 200
    for status in ("RETRYING", "Retrying", "Done", "DONE"):
        page = client.get("/jobs", params={"status": status}, headers=PAGE)
        assert page.status_code == 400, status
