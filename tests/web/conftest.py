"""The console under test: the ASGI app on a real database, reached in-process
(Starlette's test client) or over a socket (uvicorn, for the browser tests)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

# Starlette would rather drive its test client with httpx2; httpx works the same.
warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from starlette.testclient import TestClient  # noqa: E402

from rota.web import AuthSettings, WebSettings, create_app  # noqa: E402

TOKEN = "s3cret-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
HTML = {"Accept": "text/html"}


def make_client(db_url: str, client: tuple[str, int] | None = None, **settings: Any) -> TestClient:
    auth = settings.pop("auth", AuthSettings(token=TOKEN))
    app = create_app(WebSettings(dsn=db_url, auth=auth, sample_seconds=0, **settings))
    return TestClient(app, base_url="http://console.test", client=client or ("10.9.9.9", 50000))


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    """The console with a token; not logged in."""
    with make_client(db_url) as c:
        yield c


@pytest.fixture
def operator(client: TestClient) -> TestClient:
    """The same console, logged in through the login form (a session cookie)."""
    response = client.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return client


def csrf_of(client: TestClient, path: str = "/types") -> str:
    page = client.get(path, headers=HTML)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "no CSRF value on the page"
    return found.group(1)


def add_job(
    conn: psycopg.Connection[Any], job_type: str = "email", status: str = "ready", **columns: Any
) -> int:
    columns = {"type": job_type, "status": status, **columns}
    if status in ("done", "failed", "dead", "cancelled"):
        columns.setdefault("finished_at", "2030-01-01T00:00:00Z")
    names = ", ".join(columns)
    marks = ", ".join(["%s"] * len(columns))
    row = conn.execute(
        f"INSERT INTO rota.job ({names}) VALUES ({marks}) RETURNING id",  # type: ignore[arg-type]
        list(columns.values()),
    ).fetchone()
    assert row is not None
    return int(row["id"] if isinstance(row, dict) else row[0])


def audit_rows(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return list(conn.execute("SELECT * FROM rota.audit ORDER BY id").fetchall())
