"""`rota web` serves the console, refuses bad settings with exit code 2, and serves
the pinned front-end file."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib import resources

import pytest

from rota.cli import main
from tests.acceptance.procs import env_for, free_port, probe, wait_for
from tests.web.conftest import add_job

# sha256 of dist/htmx.min.js in the npm package htmx.org@2.0.11 (see mk/web.mk).
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--port", "0"], "--port must be from 1 to 65535"),
        (["--port", "http"], "--port is not a whole number"),
        (["--proxy-header", "X-Forwarded-User"], "--proxy-header needs --proxy-from"),
        (["--proxy-header", "X-User", "--proxy-from", "10.0.0.300/8"], "--proxy-from"),
        (["--forwarded-from", "not-an-address"], "--forwarded-from"),
        (
            ["--proxy-header", "X-User", "--proxy-from", "10.0.0.0/8", "--operator-group", "ops"],
            "--operator-group needs --proxy-groups-header",
        ),
    ],
)
def test_bad_settings_exit_2_with_one_line(capsys, args, reason):
    assert main(["web", *args]) == 2
    err = capsys.readouterr().err
    assert reason in err and err.count("\n") == 1


def test_the_served_htmx_is_the_pinned_release():
    data = (resources.files("rota.web") / "static" / "htmx.min.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == HTMX_SHA256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=b"", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_rota_web_serves_the_console_and_refuses_an_anonymous_post(db_url, conn):
    job_id = add_job(conn, "email", "dead")
    port = _free_port()
    env = dict(os.environ, ROTA_DATABASE_URL=db_url, ROTA_WEB_TOKEN="t0ken")
    server = subprocess.Popen(
        [sys.executable, "-m", "rota", "web", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[1]
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=5) as response:
                    assert response.read() == b"ok\n"
                    break
            except OSError:
                assert time.monotonic() < deadline, "rota web did not answer"
                time.sleep(0.1)
        status, _ = _post(f"{base}/jobs/{job_id}/retry", {})
        assert status == 401
        assert conn.execute("SELECT status FROM rota.job").fetchone()["status"] == "dead"
        status, body = _post(
            f"{base}/jobs/{job_id}/retry",
            {"Authorization": "Bearer t0ken", "Accept": "application/json"},
        )
        assert status == 200 and b'"rows":1' in body
    finally:
        server.terminate()
        server.communicate(timeout=60)


def test_on_a_database_without_the_schema_every_page_says_run_migrate(empty_db_url):
    from tests.web.conftest import BEARER, HTML, make_client

    with make_client(empty_db_url) as client:
        for path in ("/", "/jobs", "/dead", "/types"):
            page = client.get(path, headers={**BEARER, **HTML})
            assert page.status_code == 503, (path, page.status_code)
            assert "run `rota migrate`" in page.text
        answer = client.get("/jobs", headers=BEARER)
        assert answer.status_code == 503 and "rota migrate" in answer.json()["error"]


def test_a_port_in_use_exits_1_saying_to_choose_another(capsys, monkeypatch, db_url):
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["web", "--port", str(port)]) == 1
    assert f"could not listen on 127.0.0.1:{port}: choose another --port" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_console_stopped_by_a_signal_exits_0(db_url, sig):
    # uvicorn raises the signal it stopped on again once it has shut down;
    # `rota web` ends as every other command does after a clean stop.
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rota", "web", "--port", str(port)],
        env=env_for(db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: probe(port, "/healthz") == 200, 60, "the console to answer")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, err
