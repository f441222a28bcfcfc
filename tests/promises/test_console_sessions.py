"""The console's sessions end with its token, and its POSTs come from its own pages.

A session cookie carries a keyed mark of the token it was made with: after the
token is changed (the same ROTA_WEB_SECRET signing cookies, as on replicas),
every session made with the old one is refused. A POST whose Origin (or
Referer) names another site is refused with 403 before anything is written.
"""

from __future__ import annotations

import warnings
from typing import Any

import psycopg

import rota
from rota.web import AuthSettings

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from tests.web.conftest import HTML, csrf_of, make_client  # noqa: E402

SECRET = b"kept-across-rotations-0123456789"


def _logged_in(db_url: str, token: str) -> Any:
    client = make_client(db_url, auth=AuthSettings(token=token, secret=SECRET))
    client.__enter__()
    response = client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return client


def test_a_rotated_token_ends_every_session_made_with_the_old_one(db_url: str) -> None:
    old = _logged_in(db_url, "old-token")
    try:
        cookies = dict(old.cookies)
        assert old.get("/jobs", headers=HTML).status_code == 200
    finally:
        old.__exit__(None, None, None)
    rotated = make_client(db_url, auth=AuthSettings(token="new-token", secret=SECRET))
    with rotated:
        rotated.cookies.update(cookies)
        page = rotated.get("/jobs", headers=HTML, follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        api = rotated.get("/jobs", headers={"Accept": "application/json"})
        assert api.status_code == 401
    again = make_client(db_url, auth=AuthSettings(token="old-token", secret=SECRET))
    with again:  # the same token again: the session (its row still alive) works again
        again.cookies.update(cookies)
        assert again.get("/jobs", headers=HTML).status_code == 200


def test_posts_from_another_site_are_refused(db_url: str, conn: psycopg.Connection[Any]) -> None:
    job_id = rota.enqueue(conn, "t")
    client = _logged_in(db_url, "token")
    try:
        csrf = csrf_of(client)
        form = {"csrf": csrf, "next": "/jobs"}
        for origin in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                       {"Referer": "https://evil.example/page"}):  # fmt: skip
            refused = client.post(f"/jobs/{job_id}/cancel", data=form, headers=origin)
            assert refused.status_code == 403, (origin, refused.text)
            assert "another site" in refused.text
        status = conn.execute("SELECT status FROM rota.job WHERE id = %s", (job_id,)).fetchone()
        assert status == {"status": "ready"}
        own = client.post(
            f"/jobs/{job_id}/cancel",
            data=form,
            headers={"Origin": "http://console.test"},
            follow_redirects=False,
        )
        assert own.status_code == 303, own.text
    finally:
        client.__exit__(None, None, None)


def test_logging_in_or_out_from_another_site_is_refused(db_url: str) -> None:
    client = make_client(db_url, auth=AuthSettings(token="token", secret=SECRET))
    with client:
        evil = {"Origin": "https://evil.example"}
        login = client.post(
            "/login", data={"token": "token", "next": "/"}, headers=evil, follow_redirects=False
        )
        assert login.status_code == 403 and "another site" in login.text
        assert "rota_session" not in "".join(login.headers.get_list("set-cookie"))
        own = client.post(
            "/login",
            data={"token": "token", "next": "/"},
            headers={"Origin": "http://console.test"},
            follow_redirects=False,
        )
        assert own.status_code == 303, own.text
        logout = client.post("/logout", headers=evil, follow_redirects=False)
        assert logout.status_code == 403
        assert client.get("/jobs", headers=HTML).status_code == 200  # still logged in
