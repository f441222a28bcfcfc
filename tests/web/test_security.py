"""Who may see and do what: tokens, sessions, CSRF, the proxy header, read-only mode;
and hostile input that must stay text and data."""

from __future__ import annotations

import re

import pytest
from psycopg.types.json import Jsonb

from rota.web import AuthSettings
from tests.web.conftest import BEARER, HTML, TOKEN, add_job, audit_rows, make_client

SCRIPT = "<script>alert('x')</script>"


def test_a_script_in_a_payload_or_error_renders_as_text(client, conn):
    job_id = add_job(
        conn, SCRIPT, "dead", payload=Jsonb({"name": SCRIPT}), last_error=f"ValueError: {SCRIPT}"
    )
    for path in (f"/jobs/{job_id}", "/jobs", "/dead", "/", f"/jobs?type={SCRIPT}"):
        page = client.get(path, headers=BEARER).text
        assert "<script>alert" not in page, path
        assert "&lt;script&gt;" in page or "\\u003cscript\\u003e" in page, path


def test_an_action_without_the_token_is_refused_and_writes_nothing(client, conn):
    job_id = add_job(conn, "email", "dead")
    assert client.post(f"/jobs/{job_id}/retry").status_code == 401
    bad = {"Authorization": "Bearer wrong"}
    assert client.post(f"/jobs/{job_id}/retry", headers=bad).status_code == 401
    assert client.post("/jobs/bulk", data={"action": "retry"}).status_code == 401
    assert client.post("/types/pause", data={"all": "1"}).status_code == 401
    assert conn.execute("SELECT status FROM rota.job").fetchone()["status"] == "dead"
    assert audit_rows(conn) == []
    assert conn.execute("SELECT count(*) AS n FROM rota.paused_type").fetchone()["n"] == 0


def test_pages_need_a_login_when_a_token_is_set(client):
    assert client.get("/jobs").status_code == 401
    page = client.get("/jobs", headers=HTML, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"].startswith("/login?next=%2Fjobs")
    wrong = client.post("/login", data={"token": "nope"}, headers=HTML)
    assert wrong.status_code == 401 and "not the token" in wrong.text


def test_a_session_action_without_the_csrf_value_is_refused(operator, conn):
    job_id = add_job(conn, "email", "dead")
    for data in ({}, {"csrf": "forged"}):
        response = operator.post(f"/jobs/{job_id}/retry", data=data)
        assert response.status_code == 403, data
        assert "CSRF" in response.json()["error"]
    assert conn.execute("SELECT status FROM rota.job").fetchone()["status"] == "dead"
    assert audit_rows(conn) == []


def test_a_forged_session_cookie_is_not_a_login(db_url):
    with make_client(db_url) as c:
        c.cookies.set("rota_session", "eyJ1IjoieCIsInIiOiJvcGVyYXRvciJ9.AAAA")
        assert c.get("/jobs").status_code == 401


PROXY = AuthSettings(
    token=TOKEN,
    proxy_header="X-Forwarded-User",
    proxy_groups_header="X-Forwarded-Groups",
    proxy_addresses=("127.0.0.0/8",),
    operator_groups=frozenset({"oncall"}),
)
FROM_PROXY = ("127.0.0.1", 50000)


def test_proxy_users_are_viewers_unless_listed_and_viewers_cannot_act(db_url, conn):
    job_id = add_job(conn, "email", "dead")
    with make_client(db_url, client=FROM_PROXY, auth=PROXY) as c:
        ann = {"X-Forwarded-User": "ann"}
        page = c.get(f"/jobs/{job_id}", headers={**ann, **HTML})
        assert page.status_code == 200 and "ann (viewer)" in page.text
        assert ">Retry<" not in page.text
        refused = c.post(f"/jobs/{job_id}/retry", headers=ann)
        assert refused.status_code == 403 and "viewer" in refused.json()["error"]
        bob = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "staff, oncall"}
        page = c.get(f"/jobs/{job_id}", headers={**bob, **HTML})
        assert "bob (operator)" in page.text
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found
        assert c.post(f"/jobs/{job_id}/retry", headers=bob).status_code == 403  # no CSRF
        # Another user's CSRF value is not bob's.
        other = c.get("/types", headers={"X-Forwarded-User": "carol", **HTML}).text
        carol = re.search(r'name="csrf" value="([^"]+)"', other)
        assert carol is None  # a viewer's pages carry no action forms at all
        done = c.post(f"/jobs/{job_id}/retry", headers=bob, data={"csrf": found.group(1)})
        assert done.status_code == 200
    [row] = audit_rows(conn)
    assert (row["actor"], row["role"]) == ("bob", "operator")


def test_a_proxy_user_is_known_whatever_authorization_the_proxy_also_sends(db_url, conn):
    # oauth2-proxy's --pass-basic-auth (on by default) adds "Basic base64(user:)".
    job_id = add_job(conn, "email", "dead")
    basic = {"Authorization": "Basic YW5uOg=="}
    with make_client(db_url, client=FROM_PROXY, auth=PROXY) as c:
        ann = {"X-Forwarded-User": "ann", **basic}
        page = c.get(f"/jobs/{job_id}", headers={**ann, **HTML}, follow_redirects=False)
        assert page.status_code == 200 and "ann (viewer)" in page.text
        bob = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "oncall", **basic}
        page = c.get(f"/jobs/{job_id}", headers={**bob, **HTML}).text
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found
        done = c.post(f"/jobs/{job_id}/retry", headers=bob, data={"csrf": found.group(1)})
        assert done.status_code == 200, done.text
        # Without the proxy's header, Authorization alone decides, as from anywhere.
        assert c.get("/jobs", headers=basic).status_code == 401
        assert c.get("/jobs", headers=BEARER).status_code == 200
    with make_client(db_url, auth=PROXY) as c:  # not from the proxy
        assert c.get("/jobs", headers={"X-Forwarded-User": "ann", **basic}).status_code == 401
    [row] = audit_rows(conn)
    assert (row["actor"], row["role"]) == ("bob", "operator")


def test_the_proxy_header_from_elsewhere_is_ignored(db_url, conn):
    settings = AuthSettings(
        token=TOKEN, proxy_header="X-Forwarded-User", proxy_addresses=("10.1.2.3",),
        operators=frozenset({"bob"}),
    )  # fmt: skip
    job_id = add_job(conn, "email", "dead")
    with make_client(db_url, auth=settings) as c:
        assert c.get("/jobs", headers={"X-Forwarded-User": "bob"}).status_code == 401
        assert (
            c.post(f"/jobs/{job_id}/retry", headers={"X-Forwarded-User": "bob"}).status_code == 401
        )
    assert audit_rows(conn) == []


def test_read_only_hides_and_refuses_every_action(db_url, conn):
    job_id = add_job(conn, "email", "dead")
    with make_client(db_url, read_only=True) as c:
        page = c.get(f"/jobs/{job_id}", headers={**BEARER, **HTML})
        assert "read-only" in page.text and 'action="/jobs/' not in page.text
        assert c.post(f"/jobs/{job_id}/retry", headers=BEARER).status_code == 403
        assert c.post("/types/pause", data={"all": "1"}, headers=BEARER).status_code == 403
    assert audit_rows(conn) == []


def test_without_any_auth_configured_anybody_looks_and_nobody_acts(db_url, conn):
    job_id = add_job(conn, "email", "dead")
    with make_client(db_url, auth=AuthSettings()) as c:
        assert c.get("/jobs").status_code == 200
        assert c.post(f"/jobs/{job_id}/retry").status_code == 403
    assert audit_rows(conn) == []


@pytest.mark.parametrize(
    "value",
    [
        "'; DROP TABLE rota.job; --",
        "x' OR '1'='1",
        '" OR 1=1 --',
        "%_\\",
        "a=b'; --",
        '{"a\'": "\';--"}',
    ],
)
def test_sql_meta_characters_in_filters_are_just_text(client, conn, value):
    add_job(conn, "email", "ready", payload=Jsonb({"a": 1}))
    for name in ("type", "key", "payload"):
        response = client.get("/jobs", params={name: value}, headers=BEARER)
        assert response.status_code in (200, 400), (name, response.text)
        assert 'href="/jobs/1"' not in response.text
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 1
