"""examples/fastapi: a request's user row and its job commit together or not at
all, and a worker runs the job with the example's handlers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rota
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _running

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

EXAMPLE = Path(__file__).parents[2] / "examples" / "fastapi"


@pytest.fixture
def client(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in ("app", "handlers"):
        sys.modules.pop(name, None)
    import app

    with TestClient(app.app) as made:
        yield made
    for name in ("app", "handlers"):
        sys.modules.pop(name, None)


def committed(db_url: str) -> tuple[list[str], list[Any]]:
    with psycopg.connect(db_url) as conn:
        users = [r[0] for r in conn.execute("SELECT email FROM app_user ORDER BY id")]
        jobs = [r[0] for r in conn.execute("SELECT payload FROM rota.job ORDER BY id")]
    return users, jobs


def test_a_sign_up_and_its_welcome_job_commit_together(client, db_url) -> None:
    made = client.post("/signups", json={"email": "a@example.com"})
    assert made.status_code == 200, made.text
    assert client.post("/signups", json={"email": "b@blocked.example"}).status_code == 403
    assert client.post("/signups", json={"email": "a@example.com"}).status_code == 409
    users, jobs = committed(db_url)
    assert users == ["a@example.com"]
    assert jobs == [{"user_id": made.json()["user"], "email": "a@example.com"}]

    import handlers

    served = {"email.welcome": rota.handlers.registered()["email.welcome"]}
    assert handlers.welcome is served["email.welcome"].func
    job_id = made.json()["job"]
    with _running(db_url, served, concurrency=1):
        wait_for(lambda: rota.result(db_url, job_id)[0] == "done", what="the welcome job")
    assert rota.result(db_url, job_id)[1] == {"sent_to": "a@example.com"}
