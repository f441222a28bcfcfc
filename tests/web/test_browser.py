"""The console in a real headless Chromium (Debian's package, driven by Playwright):
log in, read the overview and its charts, filter, tick jobs and act on them,
open jobs, retry, cancel, bulk-retry a dead group, run a schedule now, pause a
type, and find it all on the audit page; then the same console on a 390 px
phone and in the dark scheme. Nothing may trip the Content-Security-Policy.
Takes screenshots as it goes: into docs/ (docs/console.md shows them) with
ROTA_WEB_SCREENSHOTS=1, which `make web-screenshots` sets, else into the
test's temporary directory."""

from __future__ import annotations

import math
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
    totals = {"mail": 3000, "report": 1500, "invoice": 500}
    done = sum(totals.values())
    for minute in range(60, 0, -1):  # a working hour behind the charts
        at = now - timedelta(minutes=minute)
        added = {
            "mail": round(70 + 25 * math.sin(minute / 7) + (minute * 37) % 9),
            "report": round(30 + 12 * math.cos(minute / 5) + (minute * 11) % 5),
            "invoice": round(8 + 4 * math.sin(minute / 3)),
        }
        for name, n in added.items():
            totals[name] += n
            conn.execute(
                "INSERT INTO rota.queue_sample_type VALUES"
                " (date_trunc('minute', %s::timestamptz), %s, %s, 0, 0, 0)",
                [at, name, totals[name]],
            )
        done += sum(added.values())
        conn.execute(
            "INSERT INTO rota.queue_sample VALUES (date_trunc('minute', %s::timestamptz),"
            " %s, 0, %s, 3, %s)",
            [at, done, 20 + minute % 9, 4 + 3 * math.sin(minute / 9) + (minute * 13) % 5 * 0.6],
        )
    workers.register(conn, workers.WorkerInfo("worker-a1", concurrency=8, types=("mail", "report")))
    schedule_store.upsert(
        conn, schedule_store.ScheduleSpec("nightly-report", "report", "30 2 * * *", "Europe/Berlin")
    )
    errors = [
        {
            "attempt": n,
            "at": (now - timedelta(minutes=45 - 9 * n)).isoformat(),
            "error": TRACEBACK
            if n == 5
            else "TimeoutError: the SMTP server did not answer in 30 s",
        }
        for n in range(1, 6)
    ]
    ids = {
        "order": add_job(
            conn, "mail", "ready", payload=Jsonb({"to": "ann@example.com", "order": 1234})
        ),
        "dead": add_job(
            conn, "mail", "dead", payload=Jsonb({"to": "bob@example.com"}), attempts=5,
            max_attempts=5, last_error=TRACEBACK, errors=Jsonb(errors),
            idempotency_key="welcome-bob", priority=2, timeout_seconds=30,
            started_at=now - timedelta(seconds=33), finished_at=now - timedelta(seconds=3),
        ),
        "running": add_job(
            conn, "report", "running", locked_by="worker-a1", attempts=1,
            locked_until=now + timedelta(seconds=30), started_at=now - timedelta(minutes=2),
        ),
        "done": add_job(
            conn, "report", "done", result=Jsonb({"rows": 1204, "file": "s3://reports/daily.csv"}),
            started_at=now - timedelta(minutes=5), finished_at=now - timedelta(minutes=4),
        ),
    }  # fmt: skip
    conn.execute(
        "INSERT INTO rota.job_effect (job_key, effect, result)"
        " VALUES ('welcome-bob', 'template-rendered', '{\"bytes\": 5120}')"
    )
    for n in range(3):
        add_job(conn, "mail", "dead", attempts=5, max_attempts=5, last_error=TRACEBACK,
                payload=Jsonb({"to": f"user{n}@example.com"}),
                finished_at=now - timedelta(minutes=20 + n))  # fmt: skip
    add_job(conn, "mail", "dead", last_error="ValueError: no address", payload=Jsonb({}),
            finished_at=now - timedelta(minutes=50))  # fmt: skip
    for n in range(12):
        add_job(conn, "mail", "done", payload=Jsonb({"to": f"u{n}@example.com"}),
                finished_at=now - timedelta(minutes=n * 3))  # fmt: skip
    for n in range(2):
        add_job(conn, "invoice", "failed", attempts=1, max_attempts=3, payload=Jsonb({"n": n}),
                last_error="KeyError: 'customer_id'",
                finished_at=now - timedelta(minutes=7))  # fmt: skip
    for _ in range(4):
        add_job(conn, "report", "ready", run_at=now + timedelta(hours=1))
    conn.execute(
        "INSERT INTO rota.lease_expiration (hour, count) VALUES (date_trunc('hour', now()), 1)"
    )
    return ids


def status_of(conn: Any, job_id: int) -> str:
    return conn.execute("SELECT status FROM rota.job WHERE id = %s", [job_id]).fetchone()["status"]


def _page(browser: Any, refused: list[str], **options: Any) -> Any:
    """A new page that accepts confirmations and records what the CSP refused."""
    page = browser.new_page(**options)
    page.on("dialog", lambda dialog: dialog.accept())
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    page.set_default_timeout(30_000)
    return page


def _log_in(page: Any, console: str) -> None:
    page.goto(console + "/")
    assert page.url.startswith(console + "/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(console + "/")


def _shots(tmp_path: Path) -> Path:
    shots = DOCS if os.environ.get("ROTA_WEB_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(exist_ok=True)
    return shots


def test_an_operator_steers_the_queue_in_a_browser(console, browser, conn, tmp_path):
    shots = _shots(tmp_path)
    ids = seed(conn)
    refused: list[str] = []
    page = _page(browser, refused, viewport={"width": 1280, "height": 800})

    # Log in once; the session cookie carries the rest.
    _log_in(page, console)
    assert page.locator("#types").inner_text().count("mail") >= 1
    warnings = page.inner_text("#warnings")
    assert "1 lease(s) expired this hour" in warnings
    assert page.locator("figure.chart polyline").count() == 1 + 3 + 1  # all, 3 types; age
    tooltip = page.locator("figure.chart").first.locator("rect.hover title").last.text_content()
    assert tooltip and " UTC: all types " in tooltip and "mail" in tooltip
    assert page.locator("a.count.bad").count() >= 2  # failed invoices, dead mail
    page.screenshot(path=str(shots / "console-overview.png"), full_page=True)

    # The overview refreshes itself: a new type shows up without a reload.
    add_job(conn, "invoice", "ready")
    page.wait_for_selector("#types >> text=invoice", timeout=30_000)
    page.click("#ranges >> text=24h")
    page.wait_for_url("**range=24h")

    # Filter jobs by payload, open the one found.
    page.click("nav >> text=Jobs")
    page.fill("input[name=payload]", "to=ann@example.com")
    page.click("#filter button[type=submit]")
    page.wait_for_url("**payload=to*")
    assert page.locator("#jobs tbody tr").count() == 1
    page.click(f"#jobs >> text='{ids['order']}'")
    page.wait_for_url(f"**/jobs/{ids['order']}")
    assert "ann@example.com" in page.inner_text("pre.payload")

    # Tick two dead jobs on the list and retry just those.
    page.goto(f"{console}/jobs?status=dead&type=mail")
    boxes = page.locator("#jobs tbody input[type=checkbox]")
    assert boxes.count() == 5
    boxes.nth(1).check()
    boxes.nth(2).check()
    assert page.inner_text("#ticked") == "2"
    page.screenshot(path=str(shots / "console-jobs-selection.png"), full_page=True)
    ticked = [int(boxes.nth(i).get_attribute("value")) for i in (1, 2)]
    page.click("#selection button:text-is('retry')")
    page.wait_for_selector(".flash")
    assert "2 of 2 job(s) retried" in page.inner_text(".flash")
    assert [status_of(conn, i) for i in ticked] == ["ready", "ready"]

    # A dead job: every attempt's error, the traceback; then retry it.
    page.goto(f"{console}/jobs/{ids['dead']}")
    assert "smtplib.py" in page.inner_text("pre.traceback")
    assert page.locator("#attempt-errors tbody tr").count() == 5
    page.screenshot(path=str(shots / "console-job.png"), full_page=True)
    page.click("div.actions button:text-is('Retry')")
    page.wait_for_selector(".flash")
    assert "ready again" in page.inner_text(".flash")
    assert page.inner_text("h1 .status") == "ready"
    assert status_of(conn, ids["dead"]) == "ready"

    # A finished job shows its result.
    page.goto(f"{console}/jobs/{ids['done']}")
    assert "s3://reports/daily.csv" in page.inner_text("#result")

    # A running job: its worker, how long it ran, its lease; cancel it.
    page.goto(f"{console}/jobs/{ids['running']}")
    assert "worker-a1 · ran 2m" in page.inner_text("table.fields")
    page.click("div.actions button:text-is('Cancel')")
    page.wait_for_selector(".flash")
    assert "asked to stop" in page.inner_text(".flash")
    assert "cancel requested" in page.inner_text("table.fields")

    # Retry the biggest dead-letter group at once.
    page.click("nav >> text=Dead letters")
    group = page.locator("#dead tbody tr", has_text="SMTPError")
    assert group.locator("td").nth(2).inner_text() == "1"
    group.locator("button").click()
    page.wait_for_selector(".flash")
    assert "1 dead mail job(s) (SMTPError) retried" in page.inner_text(".flash")

    # Bulk from a filter: count, confirm, done.
    page.goto(f"{console}/jobs?status=dead&type=mail")
    page.click("a.button:text-is('retry…')")
    assert "1 job(s) will be retried" in page.inner_text("#bulk-count")
    page.click("button:has-text('Yes, retry')")
    page.wait_for_selector(".flash")
    assert "1 job(s) retried" in page.inner_text(".flash")

    # A schedule: run it now, see the job among its recent ones.
    page.click("nav >> text=Schedules")
    nightly = page.locator("section.schedule", has_text="nightly-report")
    nightly.locator("button:text-is('Run now')").click()
    page.wait_for_selector(".flash")
    assert "schedule nightly-report: job" in page.inner_text(".flash")
    nightly = page.locator("section.schedule", has_text="nightly-report")
    assert nightly.locator(".recent-jobs tbody tr").count() == 1
    assert "CET" in nightly.inner_text() or "CEST" in nightly.inner_text()
    archiver = page.inner_text(".archive-settings")  # the built-in rota/archive schedule
    assert "7d after they finish" in archiver and "archived rows are kept" in archiver
    page.screenshot(path=str(shots / "console-schedules.png"), full_page=True)

    # Pause a type; Types tells a type no worker serves.
    page.click("nav >> text=Types")
    assert "no live worker" in page.locator("#type-list tr[data-type=invoice]").inner_text()
    page.locator("#type-list tr[data-type=report] button").click()
    page.wait_for_selector(".flash")
    assert "paused" in page.locator("#type-list tr[data-type=report]").inner_text()
    assert conn.execute("SELECT type FROM rota.paused_type").fetchone()["type"] == "report"

    # The live refresh pauses at a click, and stays paused after a reload.
    page.click("#live-toggle")
    assert page.inner_text("#live-toggle") == "live: paused"
    page.reload()
    assert page.inner_text("#live-toggle") == "live: paused"
    page.click("#live-toggle")

    # Workers show what they run.
    page.click("nav >> text=Workers")
    assert "worker-a1" in page.inner_text("#worker-list")

    # The audit page tells who did all of it.
    page.click("nav >> text=Audit")
    audit = page.inner_text("#audit")
    for action in ("selected-retry", "retry", "cancel", "retry-dead-group", "bulk-retry",
                   "run-schedule", "pause"):  # fmt: skip
        assert action in audit, action
    assert refused == []


def test_the_console_on_a_phone_and_in_the_dark(console, browser, conn, tmp_path):
    shots = _shots(tmp_path)
    ids = seed(conn)
    refused: list[str] = []
    phone = _page(
        browser, refused, viewport={"width": 390, "height": 844}, device_scale_factor=2,
        is_mobile=True, has_touch=True,
    )  # fmt: skip
    _log_in(phone, console)
    for path in ("/", "/jobs", f"/jobs/{ids['dead']}", "/schedules", "/types", "/workers"):
        phone.goto(console + path)
        wide = phone.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, (path, wide)  # wide tables scroll inside the page, not the page
    phone.goto(console + "/")
    phone.screenshot(path=str(shots / "console-mobile.png"), full_page=False)

    dark = _page(browser, refused, viewport={"width": 1280, "height": 800}, color_scheme="dark")
    _log_in(dark, console)
    background = dark.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(20, 24, 29)", background
    dark.screenshot(path=str(shots / "console-dark.png"), full_page=True)
    assert refused == []
