"""The console in a real headless Chromium (Debian's package, driven by Playwright):
log in, read the overview, filter, open jobs, retry, cancel, bulk-retry a dead
group, pause a type, and find it all on the audit page. Takes screenshots as it
goes: into docs/ (docs/console.md shows them) with ROTA_WEB_SCREENSHOTS=1, which
`make web-screenshots` sets, else into the test's temporary directory."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from rota import schedule_store, workers
from rota.web import AuthSettings, WebSettings, create_app
from tests.web.conftest import TOKEN, add_job

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
DOCS = Path(__file__).resolve().parents[2] / "docs"

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not Path(CHROMIUM).exists():
    pytest.skip(
        "chromium is not installed (as root: apt-get install chromium); browser tests skipped",
        allow_module_level=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def console(db_url: str) -> Iterator[str]:
    """The console served by uvicorn on a free port; yields its base URL."""
    import uvicorn

    app = create_app(WebSettings(dsn=db_url, auth=AuthSettings(token=TOKEN), sample_seconds=0))
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", proxy_headers=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start"
        assert thread.is_alive(), "the console stopped"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


TRACEBACK = (
    "SMTPError: 451 4.7.1 try again later\n"
    '  File "/app/mail.py", line 41, in send\n    smtp.sendmail(sender, to, body)\n'
    '  File "/usr/lib/python3.11/smtplib.py", line 901, in sendmail\n'
    "    raise SMTPDataError(code, resp)\n"
)


def seed(conn: Any) -> dict[str, int]:
    now = datetime.now(UTC)
    done = 5000
    for minute in range(40, 0, -1):  # a working hour behind the charts
        done += 90 + (minute * 37) % 60
        conn.execute(
            "INSERT INTO rota.queue_sample VALUES (date_trunc('minute', %s::timestamptz),"
            " %s, %s, %s, 3, %s)",
            [now - timedelta(minutes=minute), done, 12 + (40 - minute) // 8, 20 + minute % 9,
             2.0 + (minute * 13) % 11 * 1.5],
        )  # fmt: skip
    workers.register(conn, workers.WorkerInfo("worker-a1", concurrency=8, types=("mail", "report")))
    schedule_store.upsert(
        conn, schedule_store.ScheduleSpec("nightly-report", "report", "30 2 * * *", "Europe/Berlin")
    )
    ids = {
        "order": add_job(
            conn, "mail", "ready", payload=Jsonb({"to": "ann@example.com", "order": 1234})
        ),
        "dead": add_job(
            conn,
            "mail",
            "dead",
            payload=Jsonb({"to": "bob@example.com"}),
            attempts=5,
            max_attempts=5,
            last_error=TRACEBACK,
            idempotency_key="welcome-bob",
            priority=2,
            timeout_seconds=30,
            started_at=now - timedelta(seconds=3),
            finished_at=now,
        ),
        "running": add_job(
            conn,
            "report",
            "running",
            locked_by="worker-a1",
            attempts=1,
            locked_until=now + timedelta(seconds=30),
            started_at=now,
        ),
    }
    conn.execute(
        "INSERT INTO rota.job_effect (job_key, effect, result)"
        " VALUES ('welcome-bob', 'template-rendered', '{\"bytes\": 5120}')"
    )
    for n in range(3):
        add_job(conn, "mail", "dead", attempts=5, max_attempts=5, last_error=TRACEBACK,
                payload=Jsonb({"to": f"user{n}@example.com"}))  # fmt: skip
    add_job(conn, "mail", "dead", last_error="ValueError: no address", payload=Jsonb({}))
    for n in range(12):
        add_job(conn, "mail", "done", payload=Jsonb({"to": f"u{n}@example.com"}))
    for _ in range(4):
        add_job(conn, "report", "ready", run_at=now + timedelta(hours=1))
    return ids


def status_of(conn: Any, job_id: int) -> str:
    return conn.execute("SELECT status FROM rota.job WHERE id = %s", [job_id]).fetchone()["status"]


def test_an_operator_steers_the_queue_in_a_browser(console, browser, conn, tmp_path):
    shots = DOCS if os.environ.get("ROTA_WEB_SCREENSHOTS") == "1" else tmp_path
    ids = seed(conn)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.on("dialog", lambda dialog: dialog.accept())
    refused: list[str] = []  # what the Content-Security-Policy blocked, if anything
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    page.set_default_timeout(30_000)

    # Log in once; the session cookie carries the rest.
    page.goto(console + "/")
    assert page.url.startswith(console + "/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(console + "/")
    assert page.locator("#types").inner_text().count("mail") >= 1
    assert page.locator("figure.chart polyline").count() == 2
    shots.mkdir(exist_ok=True)
    page.screenshot(path=str(shots / "console-overview.png"), full_page=True)

    # The overview refreshes itself: a new type shows up without a reload.
    add_job(conn, "invoice", "ready")
    page.wait_for_selector("#types >> text=invoice", timeout=30_000)

    # Filter jobs by payload, open the one found.
    page.click("nav >> text=Jobs")
    page.fill("input[name=payload]", "to=ann@example.com")
    page.click("#filter button[type=submit]")
    page.wait_for_url("**payload=to*")
    rows = page.locator("#jobs tbody tr")
    assert rows.count() == 1
    page.click(f"#jobs >> text='{ids['order']}'")
    page.wait_for_url(f"**/jobs/{ids['order']}")
    assert "ann@example.com" in page.inner_text("pre.payload")

    # A dead job: its traceback, then retry it and see it ready.
    page.goto(f"{console}/jobs/{ids['dead']}")
    assert "smtplib.py" in page.inner_text("pre.traceback")
    page.screenshot(path=str(shots / "console-job.png"), full_page=True)
    page.click("button:text-is('Retry')")
    page.wait_for_selector(".flash")
    assert "ready again" in page.inner_text(".flash")
    assert page.inner_text("h1 .status") == "ready"
    assert status_of(conn, ids["dead"]) == "ready"

    # Cancel a running job: its worker is asked to stop it.
    page.goto(f"{console}/jobs/{ids['running']}")
    page.click("button:text-is('Cancel')")
    page.wait_for_selector(".flash")
    assert "asked to stop" in page.inner_text(".flash")
    assert "cancel requested" in page.inner_text("table.fields")

    # Retry the biggest dead-letter group at once.
    page.click("nav >> text=Dead letters")
    group = page.locator("#dead tbody tr", has_text="SMTPError")
    assert group.locator("td").nth(2).inner_text() == "3"
    group.locator("button").click()
    page.wait_for_selector(".flash")
    assert "3 dead mail job(s) (SMTPError) retried" in page.inner_text(".flash")
    assert "SMTPError" not in page.inner_text("#dead")

    # Bulk from a filter: count, confirm, done.
    page.goto(f"{console}/jobs?status=dead&type=mail")
    page.click("a.button:text-is('retry…')")
    assert "1 job(s) will be retried" in page.inner_text("#bulk-count")
    page.click("button:has-text('Yes, retry')")
    page.wait_for_selector(".flash")
    assert "1 job(s) retried" in page.inner_text(".flash")

    # Pause a type.
    page.click("nav >> text=Types")
    page.locator("#type-list tr[data-type=report] button").click()
    page.wait_for_selector(".flash")
    assert "paused" in page.locator("#type-list tr[data-type=report]").inner_text()
    assert conn.execute("SELECT type FROM rota.paused_type").fetchone()["type"] == "report"

    # Workers and schedules show what they run and when.
    page.click("nav >> text=Workers")
    assert "worker-a1" in page.inner_text("#worker-list")
    page.click("nav >> text=Schedules")
    assert "nightly-report" in page.inner_text("main")
    archiver = page.inner_text(".archive-settings")  # the built-in rota/archive schedule
    assert "7d after they finish" in archiver and "archived rows are kept" in archiver

    # The audit page tells who did all of it.
    page.click("nav >> text=Audit")
    audit = page.inner_text("#audit")
    for action in ("retry", "cancel", "retry-dead-group", "bulk-retry", "pause"):
        assert action in audit, action
    assert audit.count("token") >= 5
    assert refused == []
