"""The console tried as an attacker would: headers that forbid inline script and
framing, messages only from the server, malformed input answered 4xx, Secure
cookies behind a trusted proxy, logout that ends the session, proxy users and
groups kept apart. Each test failed before its fix."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from psycopg.types.json import Jsonb
from starlette.testclient import TestClient

from rota import schedule_store
from rota.web import AuthSettings, reads
from tests.web.conftest import BEARER, HTML, TOKEN, add_job, audit_rows, csrf_of, make_client

JSON = {**BEARER, "Accept": "application/json"}
PAGES = ["/", "/jobs", "/dead", "/schedules", "/types", "/workers", "/audit"]


def _html_pages(client: Any, conn: Any) -> dict[str, str]:
    job_id = add_job(conn, "email", "dead", last_error="ValueError: x")
    paths = [*PAGES, f"/jobs/{job_id}", "/jobs/bulk?action=retry&status=dead"]
    found = {}
    for path in paths:
        page = client.get(path, headers={**BEARER, **HTML})
        assert page.status_code == 200, (path, page.text)
        found[path] = page.text
    return found


def test_every_answer_forbids_inline_script_framing_and_sniffing(client, conn):
    job_id = add_job(conn, "email", "dead")
    for path, status in [
        ("/", 200), ("/jobs", 200), (f"/jobs/{job_id}", 200), ("/login", 200),
        ("/static/console.css", 200), ("/jobs/999999", 404), ("/jobs?status=nope", 400),
    ]:  # fmt: skip
        response = client.get(path, headers={**BEARER, **HTML})
        assert response.status_code == status, path
        csp = response.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["script-src"] == "'self'", path
        assert "unsafe" not in csp, path
        assert directives["frame-ancestors"] == "'none'", path
        assert response.headers["x-frame-options"] == "DENY", path
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["referrer-policy"] == "same-origin", path


def test_no_page_carries_inline_script_handlers_or_styles(client, conn):
    for path, text in _html_pages(client, conn).items():
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), path
        assert not re.search(r"\son[a-z]+=", text), path
        assert "hx-on" not in text, path
        assert not re.search(r"\sstyle=", text), path
        assert '"includeIndicatorStyles": false' in text, path


def test_a_message_in_the_url_is_never_shown_as_a_banner(operator):
    bait = "Session expired: log in at https://evil.example"
    for path in PAGES:
        page = operator.get(path, params={"flash": bait}, headers=HTML)
        assert page.status_code == 400, path
        assert "evil.example" not in page.text, path
        assert 'class="flash"' not in page.text, path


def test_an_actions_message_is_shown_once_from_a_signed_cookie(operator, conn):
    job_id = add_job(conn, "email", "dead")
    csrf = csrf_of(operator, f"/jobs/{job_id}")
    done = operator.post(
        f"/jobs/{job_id}/retry", data={"csrf": csrf, "next": f"/jobs/{job_id}"},
        headers=HTML, follow_redirects=False,
    )  # fmt: skip
    assert done.status_code == 303 and "flash" not in done.headers["location"]
    first = operator.get(f"/jobs/{job_id}", headers=HTML).text
    assert f"job {job_id} is ready again" in first
    again = operator.get(f"/jobs/{job_id}", headers=HTML).text
    assert "is ready again" not in again
    # A flash cookie the console did not sign shows nothing.
    operator.cookies.set("rota_flash", "eyJtIjoiZXZpbCIsImV4cCI6OTk5OTk5OTk5OX0.AAAA")
    assert "evil" not in operator.get("/", headers=HTML).text


NASTY_VALUES = [
    "\x00",
    "a\x00b",
    '{"a": "\\u0000"}',
    '{"\\u0000": 1}',
    'a="\\u0000"',
    '{"a": "\\ud800"}',
    'a="\\udfff"',
    '{"a": 1e999}',
    "a=NaN",
    "é" * 600,
    "%",
    "\ud800",
    "2030-13-45",
    "9" * 5000,
    "-1",
    "0x10",
]


def _encoded(fields: dict[str, str]) -> str:
    """A query string or form body, bytes that are not UTF-8 included."""
    return "&".join(f"{k}={quote(v, safe='', errors='surrogatepass')}" for k, v in fields.items())


def test_malformed_filter_values_are_400_never_500(client, conn):
    add_job(conn, "email", "ready", payload=Jsonb({"a": 1}))
    for value in NASTY_VALUES:
        for name in ("status", "type", "key", "payload", "created_from", "before", "limit"):
            response = client.get("/jobs?" + _encoded({name: value}), headers=BEARER)
            assert response.status_code in (200, 400), (name, value, response.text[:200])
        for name in ("type", "payload"):
            query = _encoded({"action": "retry", name: value})
            response = client.get("/jobs/bulk?" + query, headers=BEARER)
            assert response.status_code in (200, 400), (name, value, response.text[:200])
        response = client.get(f"/jobs/{quote(value, errors='surrogatepass')}", headers=BEARER)
        assert response.status_code in (400, 404), (value, response.text[:200])


def test_malformed_form_fields_are_400_never_500(client, conn):
    add_job(conn, "email", "dead")
    for value in NASTY_VALUES:
        for path, data in [
            ("/types/pause", {"type": value}),
            ("/schedules/suspend", {"name": value}),
            ("/dead/retry", {"type": value, "error_class": value}),
            ("/jobs/bulk", {"action": "retry", "payload": value}),
            ("/jobs/bulk", {"action": "priority", "status": "ready", "priority": value}),
            ("/jobs/1/priority", {"priority": value}),
        ]:
            form = {"Content-Type": "application/x-www-form-urlencoded", **BEARER}
            response = client.post(path, content=_encoded(data), headers=form)
            assert response.status_code in (200, 400, 404, 409), (path, value, response.text)
            if not _utf8(value):  # never read as U+FFFD, a name nobody gave
                assert response.status_code == 400, (path, value, response.text)
                assert "UTF-8" in response.json()["error"], (path, value)
    written = conn.execute("SELECT target::text FROM rota.audit").fetchall()
    assert not [r for r in written if "\ufffd" in r["target"]]
    paused = conn.execute("SELECT type FROM rota.paused_type").fetchall()
    assert not [r for r in paused if "\ufffd" in r["type"]]


def _utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


NOT_UTF8 = [b"%FFx", b"%C0%AFy", b"\xffx", b"a%ED%A0%80"]


@pytest.mark.parametrize("raw", NOT_UTF8)
def test_a_form_that_is_not_utf8_is_400_and_writes_nothing(client, conn, raw):
    job_id = add_job(conn, "mail", "dead", last_error="SMTPError: x")
    form = {"Content-Type": "application/x-www-form-urlencoded", **BEARER}
    for path, body in [
        ("/types/pause", b"type=" + raw),
        ("/dead/retry", b"error_class=SMTPError&type=" + raw),
        ("/types/limit/clear", b"type=" + raw),
        ("/jobs/bulk", b"action=retry&error=" + raw),
        ("/jobs/bulk", raw + b"=1"),  # a field's name
    ]:
        response = client.post(path, content=body, headers=form)
        assert response.status_code == 400, (path, body, response.text)
        assert "UTF-8" in response.json()["error"]
    part = b'--b\r\nContent-Disposition: form-data; name="type"\r\n\r\n\xffx\r\n--b--\r\n'
    multipart = {"Content-Type": "multipart/form-data; boundary=b", **BEARER}
    response = client.post("/types/pause", content=part, headers=multipart)
    assert response.status_code == 400, response.text
    assert conn.execute("SELECT count(*) AS n FROM rota.paused_type").fetchone()["n"] == 0
    assert conn.execute("SELECT status FROM rota.job WHERE id = %s", [job_id]).fetchone() == {
        "status": "dead"
    }
    assert audit_rows(conn) == []


def test_a_form_field_written_as_json_is_read_as_its_string(client, conn):
    form = {"Content-Type": "application/x-www-form-urlencoded", **JSON}
    body = urlencode({"type:json": '"mail\\nout"'})
    assert client.post("/types/pause", content=body, headers=form).status_code == 200
    paused = conn.execute("SELECT type FROM rota.paused_type").fetchall()
    assert paused == [{"type": "mail\nout"}]
    for fields in ({"type:json": "mail"}, {"type:json": "1"}, {"type:json": '"a"', "type": "a"}):
        response = client.post("/types/resume", content=urlencode(fields), headers=form)
        assert response.status_code == 400, (fields, response.text)
    assert len(audit_rows(conn)) == 1


RAW_COOKIES = [
    "rota_session=\xe9t\xe9",
    "rota_session=caf\xc3\xa9.sig",
    "rota_session=e30.\xe9\xe9",  # a non-ASCII signature
    "rota_session=e30.caf\xc3\xa9",
    "rota_session=\x7f\x01",
    "rota_session=" + "A" * 5000,
    "rota_session=e30.",  # "{}" with an empty signature
    "rota_session=W10.x",  # "[]"
    "rota_session=.",
    "rota_flash=\xff\xfe; rota_session=x",
]


@pytest.mark.parametrize("cookie", RAW_COOKIES)
def test_malformed_cookies_are_401_never_500(client, cookie):
    header = [(b"cookie", cookie.encode("latin-1"))]
    for path in ("/", "/jobs"):
        assert client.get(path, headers=header).status_code == 401, cookie
    assert client.post("/jobs/1/retry", headers=header).status_code == 401, cookie
    assert client.post("/logout", headers=header, follow_redirects=False).status_code == 303


RAW_HEADERS = [
    (b"authorization", "Bearer caf\xe9".encode("latin-1")),
    (b"authorization", b"Bearer \xc3\xa9\xff"),
    (b"authorization", b"\xff"),
    (b"authorization", b"Basic Zm9vOmJhcg=="),
    (b"x-forwarded-user", b"\xff\xfe"),
    (b"x-forwarded-user", b"bob\x01"),
    (b"x-forwarded-groups", b"\xff, oncall\x7f"),
    (b"x-forwarded-proto", b"\xffhttps"),
    (b"accept", b"text/html\xff"),
]


@pytest.mark.parametrize("header", RAW_HEADERS)
def test_malformed_headers_are_4xx_never_500(db_url, header):
    with make_client(db_url, client=FROM_PROXY, auth=PROXY) as c:
        for path in ("/", "/jobs", "/login"):
            response = c.get(path, headers=[header])
            assert response.status_code in (200, 303, 401), (path, header, response.text)
        response = c.post("/types/pause", data={"type": "x"}, headers=[header])
        assert response.status_code in (401, 403), (header, response.text)


PROXY = AuthSettings(
    token=TOKEN,
    proxy_header="X-Forwarded-User",
    proxy_groups_header="X-Forwarded-Groups",
    proxy_addresses=("127.0.0.0/8",),
    operators=frozenset({"ann"}),
    operator_groups=frozenset({"admins"}),
)
FROM_PROXY = ("127.0.0.1", 50000)


def test_proxy_users_and_groups_are_told_apart(db_url):
    with make_client(db_url, client=FROM_PROXY, auth=PROXY) as c:

        def role(headers: dict[str, str]) -> str:
            page = c.get("/types", headers={**headers, **HTML}).text
            found = re.search(r"\((viewer|operator)\)", page)
            assert found, page
            return found.group(1)

        assert role({"X-Forwarded-User": "ann"}) == "operator"
        assert role({"X-Forwarded-User": "admins"}) == "viewer"  # a user named like a group
        assert (
            role({"X-Forwarded-User": "bob", "X-Forwarded-Groups": "staff, admins"}) == "operator"
        )
        assert role({"X-Forwarded-User": "bob", "X-Forwarded-Groups": "ann"}) == "viewer"


def _login(client: Any) -> str:
    response = client.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
    assert response.status_code == 303
    return str(response.cookies["rota_session"])


def test_logout_ends_the_session_on_the_server(db_url, conn):
    with make_client(db_url) as c:
        cookie = _login(c)
        assert c.get("/jobs").status_code == 200
        assert c.post("/logout", follow_redirects=False).status_code == 303
    # The same cookie, replayed by whoever kept a copy, is no longer a login.
    with make_client(db_url) as other:
        other.cookies.set("rota_session", cookie)
        assert other.get("/jobs").status_code == 401
        assert other.post("/types/pause", data={"all": "1"}).status_code == 401
    assert audit_rows(conn) == []


def test_cookies_are_secure_behind_a_trusted_tls_proxy_only(db_url):
    settings = AuthSettings(token=TOKEN, forwarded_addresses=("10.0.0.0/8",))
    https = {"X-Forwarded-Proto": "https"}
    with make_client(db_url, client=("10.1.2.3", 4000), auth=settings) as c:
        response = c.post("/login", data={"token": TOKEN}, headers=https, follow_redirects=False)
        assert "secure" in response.headers["set-cookie"].lower()
        plain = c.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert "secure" not in plain.headers["set-cookie"].lower()
    with make_client(db_url, client=("192.0.2.9", 4000), auth=settings) as c:
        response = c.post("/login", data={"token": TOKEN}, headers=https, follow_redirects=False)
        assert "secure" not in response.headers["set-cookie"].lower()


def test_replicas_with_one_secret_accept_each_others_sessions_and_forms(db_url, conn):
    shared = AuthSettings(token=TOKEN, secret=b"one key for every replica")
    job_id = add_job(conn, "email", "dead")
    with make_client(db_url, auth=shared) as a, make_client(db_url, auth=shared) as b:
        cookie = _login(a)
        csrf = csrf_of(a, f"/jobs/{job_id}")
        b.cookies.set("rota_session", cookie)
        done = b.post(f"/jobs/{job_id}/retry", data={"csrf": csrf}, follow_redirects=False)
        assert done.status_code == 303
    assert audit_rows(conn)[0]["action"] == "retry"


ACTIONS = [
    ("/jobs/{id}/retry", {}),
    ("/jobs/{id}/cancel", {}),
    ("/jobs/{id}/run-now", {}),
    ("/jobs/{id}/priority", {"priority": "5"}),
    ("/jobs/selected", {"action": "retry", "id": "{id}"}),
    ("/jobs/bulk", {"action": "retry", "status": "dead"}),
    ("/dead/retry", {"type": "email", "error_class": "ValueError"}),
    ("/types/pause", {"type": "email"}),
    ("/types/resume", {"type": "email"}),
    ("/types/limit", {"type": "email", "concurrency": "2"}),
    ("/types/limit/clear", {"type": "email"}),
    ("/schedules/suspend", {"name": "nightly"}),
    ("/schedules/resume", {"name": "nightly"}),
    ("/schedules/nightly/run", {}),
]


def test_an_action_refuses_unknown_fields_a_query_string_and_repeated_fields(client, conn):
    job_id = add_job(conn, "email", "dead", last_error="ValueError: x")
    schedule_store.upsert(conn, schedule_store.ScheduleSpec("nightly", "report", "* * * * *"))
    form = {"Content-Type": "application/x-www-form-urlencoded", **BEARER}
    for path, data in ACTIONS:
        path = path.format(id=job_id)
        data = {k: v.format(id=job_id) for k, v in data.items()}
        tries = [
            (path, {**data, "tpye": "delayedA"}, "unknown field 'tpye'"),
            (path + "?type=x", data, "query string"),
        ]
        tries += [
            (path, {**data, k: [v, v]}, f"{k!r} is given twice")
            for k, v in data.items()
            if k != "id"  # ticked jobs: `id` once per job
        ]
        tries += [(path, {**data, "csrf": ["a", "b"]}, "'csrf' is given twice")]
        for url, fields, reason in tries:
            body = urlencode(fields, doseq=True)
            response = client.post(url, content=body, headers=form)
            assert response.status_code == 400, (url, fields, response.text)
            assert reason in response.json()["error"], (url, fields, response.text)
            assert "\n" not in response.json()["error"]
    # The typo and the query string no longer widen a bulk action to every job.
    ready = add_job(conn, "delayedA", "ready", run_at=datetime.now(UTC) + timedelta(hours=1))
    for url, body in [
        ("/jobs/bulk", "action=run-now&tpye=delayedA"),
        ("/jobs/bulk?type=x", "action=run-now"),
        ("/jobs/bulk", "action=retry&status=dead&status=failed"),
    ]:
        assert client.post(url, content=body, headers=form).status_code == 400, url
    assert audit_rows(conn) == []
    jobs = conn.execute("SELECT id, status, run_at > now() AS later FROM rota.job ORDER BY id")
    assert [(r["status"], r["later"]) for r in jobs] == [("dead", False), ("ready", True)]
    assert conn.execute("SELECT count(*) AS n FROM rota.paused_type").fetchone()["n"] == 0
    assert conn.execute("SELECT count(*) AS n FROM rota.job_limit").fetchone()["n"] == 0
    assert schedule_store.get(conn, "nightly")["suspend"] is False
    # Ticked jobs come as `id` once per job, and every form carries csrf and next.
    body = urlencode({"action": "run-now", "id": [ready, job_id], "next": "/jobs"}, doseq=True)
    assert client.post("/jobs/selected", content=body, headers=form).status_code == 200
    assert [r["action"] for r in audit_rows(conn)] == ["selected-run-now"]


def test_a_next_as_long_as_a_page_address_is_followed_and_a_longer_one_refused(client, conn):
    job_id = add_job(conn, "email", "dead")
    page = "/jobs?" + urlencode({"error": "é" * 500, "payload": "x=" + "ü" * 498})
    done = client.post(
        f"/jobs/{job_id}/retry", data={"next": page}, headers={**BEARER, **HTML},
        follow_redirects=False,
    )  # fmt: skip
    assert done.status_code == 303, done.text
    assert done.headers["location"] == page
    again = add_job(conn, "email", "dead")
    refused = client.post(
        f"/jobs/{again}/retry", data={"next": "/" + "x" * 20_000}, headers={**BEARER, **HTML},
        follow_redirects=False,
    )  # fmt: skip
    assert refused.status_code == 400 and "next is longer" in refused.text
    assert [r["target"] for r in audit_rows(conn)] == [{"ids": [job_id]}]
    assert conn.execute("SELECT status FROM rota.job WHERE id = %s", [again]).fetchone() == {
        "status": "dead"
    }
    # A next that is no page of this console is not an error either: back to the overview.
    for target in ("https://evil.example/", "/a\x00b", "//evil.example", "/a\tb"):
        other = add_job(conn, "email", "dead")
        done = client.post(
            f"/jobs/{other}/retry", content=_encoded({"next": target}),
            headers={**BEARER, **HTML, "Content-Type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )  # fmt: skip
        assert (done.status_code, done.headers.get("location")) == (303, "/"), done.text


def _replica(conn: Any, statement: str, *params: Any) -> None:
    """A write around the checks, as a superuser with triggers off could make."""
    conn.execute("SET session_replication_role = replica")
    conn.execute(statement, params)
    conn.execute("RESET session_replication_role")


def test_a_schedule_due_at_infinity_is_shown_as_its_text(client, conn):
    schedule_store.upsert(conn, schedule_store.ScheduleSpec("forever", "report", "* * * * *"))
    schedule_store.upsert(conn, schedule_store.ScheduleSpec("daily", "report", "0 3 * * *"))
    _replica(conn, "UPDATE rota.schedule SET next_run_at = 'infinity' WHERE name = 'forever'")
    for path in ("/schedules", "/"):
        page = client.get(path, headers={**BEARER, **HTML})
        assert page.status_code == 200, page.text
        assert "infinity" in page.text
        assert "9999-12-31" not in page.text
    assert "0 3 * * *" in page.text or "daily" in page.text


@pytest.mark.parametrize(
    ("errors", "shown"),
    [
        ("5", "5"),
        ('{"not": "a list"}', '{"not": "a list"}'),
        ('[{"attempt": 1, "at": "2026-01-01T00:00:00", "error": "E1"}]', "2026-01-01T00:00:00"),
        ('[{"attempt": 1, "at": "0001-01-01T00:00:00+14:00", "error": "E2"}]', "0001-01-01"),
        ('[{"attempt": 1, "at": "infinity", "error": "E3"}, 7]', "infinity"),
    ],
)
def test_a_job_whose_errors_have_another_shape_is_shown_as_text(client, conn, errors, shown):
    job_id = add_job(conn, "email", "dead")
    _replica(conn, "UPDATE rota.job SET errors = %s::jsonb WHERE id = %s", errors, job_id)
    page = client.get(f"/jobs/{job_id}", headers={**BEARER, **HTML})
    assert page.status_code == 200, page.text
    table = page.text[page.text.index('id="attempt-errors"') :].split("</table>")[0]
    assert shown in html.unescape(table)


def test_an_internal_error_carries_the_security_headers_too(db_url, conn, monkeypatch):
    def broken(*args: Any) -> None:
        raise RuntimeError("a bug with a secret in its message")

    monkeypatch.setattr(reads, "job_detail", broken)
    job_id = add_job(conn, "email", "dead")
    app = make_client(db_url).app
    with TestClient(app, raise_server_exceptions=False) as c:
        for accept in (HTML, {"Accept": "application/json"}):
            response = c.get(f"/jobs/{job_id}", headers={**BEARER, **accept})
            assert response.status_code == 500
            assert response.headers["x-frame-options"] == "DENY"
            assert response.headers["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
            assert "secret" not in response.text


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/jobs/%D9%A3", "not a whole number"),  # ARABIC-INDIC DIGIT THREE
        ("/jobs/1_0", "not a whole number"),
        ("/jobs/+1", "not a whole number"),
        ("/jobs/%EF%BC%93", "not a whole number"),  # FULLWIDTH DIGIT THREE
        ("/jobs?limit=1_0", "not a whole number"),
        ("/jobs?before=%D9%A3", "not a whole number"),
        ("/jobs/bulk?action=priority&status=ready&priority=%EF%BC%93", "whole number"),
        ("/jobs/bulk?action=priority&status=ready", "give the new priority"),
        ("/jobs/1?x=1", "takes no parameters, not 'x'"),
        ("/dead?x=1", "takes no parameters"),
    ],
)
def test_numbers_are_ascii_digits_and_every_page_names_what_it_refuses(client, conn, path, reason):
    for _ in range(10):
        add_job(conn, "email", "ready")
    response = client.get(path, headers=BEARER)
    assert response.status_code == 400, response.text
    assert reason in response.json()["error"], response.text
    assert "None" not in response.json()["error"] and "known: )" not in response.json()["error"]


def test_form_numbers_are_ascii_digits(client, conn):
    job_id = add_job(conn, "email", "ready")
    for path, data in [
        (f"/jobs/{job_id}/priority", {"priority": "\uff13"}),  # FULLWIDTH DIGIT THREE
        (f"/jobs/{job_id}/priority", {"priority": "\u0663"}),  # ARABIC-INDIC DIGIT THREE
        ("/jobs/selected", {"action": "run-now", "id": "1_0"}),
        ("/types/limit", {"type": "email", "concurrency": "1_0"}),
        ("/types/limit", {"type": "email", "concurrency": "+3"}),
        ("/types/limit", {"type": "email", "rate": "\uff15", "per": "1"}),
        ("/types/limit", {"type": "email", "rate": "5", "per": "\uff11"}),
    ]:
        response = client.post(path, data=data, headers=BEARER)
        assert response.status_code == 400, (path, data, response.text)
    assert audit_rows(conn) == []
    spaced = {"type": "email", "concurrency": " 3 "}
    assert client.post("/types/limit", data=spaced, headers=BEARER).status_code == 200


def test_a_flash_message_of_any_script_fits_in_a_cookie_browsers_keep() -> None:
    # A browser drops a cookie over 4,096 bytes: the message after an action on
    # types named in emoji was lost (each escaped in JSON as 12 characters).
    from rota.web import auth

    settings = auth.AuthSettings(secret=b"k" * 32)
    for message in ("😀" * 1000, "é" * 1000, "a" * 1000, "\udcff" * 1000):
        value = auth.flash_cookie(settings, message)
        assert len(f"{auth.FLASH_COOKIE}={value}") < 4096, (message[:3], len(value))
        assert auth.read_flash(settings, value) == message[: auth.MAX_FLASH]
