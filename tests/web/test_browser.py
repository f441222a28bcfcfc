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
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
from psycopg.types.json import Jsonb

from rota import flow, schedule_store, workers
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
        ages = {
            "mail": 4 + 3 * math.sin(minute / 9) + (minute * 13) % 5 * 0.6,
            "report": 2 + 1.5 * math.cos(minute / 6),
            "invoice": 0.0,
        }
        for name, n in added.items():
            totals[name] += n
            conn.execute(
                "INSERT INTO rota.queue_sample_type VALUES"
                " (date_trunc('minute', %s::timestamptz), %s, %s, 0, 0, 0, %s)",
                [at, name, totals[name], ages[name]],
            )
        done += sum(added.values())
        conn.execute(
            "INSERT INTO rota.queue_sample VALUES (date_trunc('minute', %s::timestamptz),"
            " %s, 0, %s, 3, %s)",
            [at, done, 20 + minute % 9, max(ages.values())],
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
    # Throughput: all and 3 types; queue age: all and 2 types; failed attempts: all.
    assert page.locator("figure.chart polyline").count() == (1 + 3) + (1 + 2) + 1
    assert page.locator("a.count.bad").count() >= 2  # failed invoices, dead mail
    page.locator("#chart-jobs-finished-per-minute rect.hover").nth(-12).hover()
    tip = page.locator("#chart-jobs-finished-per-minute .chart-tip")
    assert " UTC" in tip.inner_text() and "mail" in tip.inner_text()
    page.screenshot(path=str(shots / "console-overview.png"), full_page=True)
    page.mouse.move(0, 0)
    tip.wait_for(state="hidden")

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
    assert "Vacuums rota.job and rebuilds its indexes when a long transaction" in archiver
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


def chart_samples(conn: Any, now: datetime) -> datetime:
    """An hour of samples whose values are known: 6 mail and 2 report jobs finish
    a minute, but 18 mail jobs in the minute 30 minutes ago (which it returns)."""
    done = {"mail": 1000, "report": 500}
    spike = now - timedelta(minutes=30)
    for minute in range(60, -1, -1):
        at = now - timedelta(minutes=minute)
        done["mail"] += 18 if at == spike else 6
        done["report"] += 2
        for name, age in (("mail", 45.0), ("report", 12.5)):
            conn.execute(
                "INSERT INTO rota.queue_sample_type VALUES (%s, %s, %s, 0, 0, 0, %s)",
                [at, name, done[name], age],
            )
        conn.execute(
            "INSERT INTO rota.queue_sample VALUES (%s, %s, 0, 1, 0, 45)", [at, sum(done.values())]
        )
    return spike


def _tip(page: Any, chart: str) -> list[str]:
    """The lines of a chart's tooltip as shown, once it is shown."""
    tip = page.locator(f"#{chart} .chart-tip")
    tip.wait_for(state="visible")
    return [line.strip() for line in tip.inner_text().splitlines() if line.strip()]


def test_a_chart_reads_out_the_point_under_the_pointer_and_the_arrow_keys(
    console, browser, conn, tmp_path
):
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    spike = chart_samples(conn, now)
    when = spike.strftime("%a %d %b %H:%M UTC")
    refused: list[str] = []
    page = _page(browser, refused, viewport={"width": 1280, "height": 800},
                 timezone_id="America/New_York")  # fmt: skip
    _log_in(page, console)
    throughput = "chart-jobs-finished-per-minute"

    # The pointer over the spike's column: its time, every line's value, the markers.
    page.locator(f'#{throughput} rect.hover[data-when="{when}"]').hover()
    assert _tip(page, throughput) == [when, "all types", "20", "mail", "18", "report", "2"]
    svg = page.locator(f"#{throughput} svg.plot")
    assert "reading" in (svg.get_attribute("class") or "")
    dots = svg.locator(".marker .dot")
    assert dots.count() == 3 and dots.first.is_visible()
    box = page.locator(f"#{throughput} .chart-tip").bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1280
    page.screenshot(path=str(tmp_path / "chart-readout.png"))

    # The next column to the right: an ordinary minute.
    column = page.locator(f'#{throughput} rect.hover[data-when="{when}"]')
    column_box = column.bounding_box()
    assert column_box is not None
    page.mouse.move(column_box["x"] + column_box["width"] * 1.5, column_box["y"] + 20)
    next_when = (spike + timedelta(minutes=1)).strftime("%a %d %b %H:%M UTC")
    assert _tip(page, throughput)[0] == next_when
    assert _tip(page, throughput)[1:] == ["all types", "8", "mail", "6", "report", "2"]

    # The pointer leaves: the readout goes.
    page.mouse.move(5, 5)
    page.locator(f"#{throughput} .chart-tip").wait_for(state="hidden")

    # The keyboard: Tab from the range links reaches the chart, which reads its
    # latest point; the arrow keys walk the points; the status line says it too.
    page.locator("#ranges a").last.focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.closest('figure').id") == throughput
    latest = _tip(page, throughput)
    assert latest[1:] == ["all types", "8", "mail", "6", "report", "2"], latest
    for _ in range(30):
        page.keyboard.press("ArrowLeft")
    assert _tip(page, throughput) == [when, "all types", "20", "mail", "18", "report", "2"]
    status = page.inner_text(f"#{throughput}-status")
    assert status == f"{when}: all types 20, mail 18, report 2"

    # While a chart is read, the live refresh waits (the next poll is held back).
    held = page.evaluate(
        "new Promise((done) => document.addEventListener('htmx:beforeRequest',"
        " (e) => done(e.defaultPrevented), {once: true}))"
    )
    assert held is True
    assert page.evaluate("document.activeElement.closest('figure').id") == throughput

    # The queue-age chart reads its own lines; Escape puts the readout away.
    page.keyboard.press("Tab")
    age = "chart-oldest-ready-job-s-age-seconds"
    assert _tip(page, age)[1:] == ["all types", "45", "mail", "45", "report", "12.5"]
    page.keyboard.press("Escape")
    page.locator(f"#{age} .chart-tip").wait_for(state="hidden")

    # In the viewer's zone (the header's times button), the time is New York's.
    page.click("#zone-toggle")
    page.locator(f'#{throughput} rect.hover[data-when="{when}"]').hover()
    local = spike.astimezone(ZoneInfo("America/New_York"))
    shown = _tip(page, throughput)[0]
    assert local.strftime("%I:%M %p") in shown and ("EST" in shown or "EDT" in shown), shown
    page.click("#zone-toggle")
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
    # A tap on a chart reads the point out, inside the screen.
    phone.locator("#chart-jobs-finished-per-minute rect.hover").nth(-20).tap()
    tip = phone.locator("#chart-jobs-finished-per-minute .chart-tip")
    tip.wait_for(state="visible")
    box = tip.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    phone.screenshot(path=str(tmp_path / "phone-readout.png"))

    dark = _page(browser, refused, viewport={"width": 1280, "height": 800}, color_scheme="dark")
    _log_in(dark, console)
    background = dark.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(20, 24, 29)", background
    dark.screenshot(path=str(shots / "console-dark.png"), full_page=True)
    dark.locator("#chart-oldest-ready-job-s-age-seconds rect.hover").nth(-1).hover()
    tip = dark.locator("#chart-oldest-ready-job-s-age-seconds .chart-tip")
    tip.wait_for(state="visible")
    assert tip.evaluate("t => getComputedStyle(t).backgroundColor") == "rgb(20, 24, 29)"
    dark.screenshot(path=str(tmp_path / "dark-readout.png"))
    assert refused == []


def test_names_with_a_line_break_come_back_from_the_console_forms_exactly(console, browser, conn):
    # A browser sends a form value's line break as CR LF: "mail\nout" would come
    # back as "mail\r\nout", another type (and "a\rb" as "a\r\nb").
    mail, limited, nightly = "mail\nout", "lim\rx", "night\nly"
    dead = [add_job(conn, mail, "dead", last_error="SMTPError: 451") for _ in range(2)]
    schedule_store.upsert(conn, schedule_store.ScheduleSpec(nightly, "report", "0 3 * * *"))
    flow.set_limit(conn, limited, concurrency=2)
    refused: list[str] = []
    page = _page(browser, refused, viewport={"width": 1280, "height": 800})
    _log_in(page, console)

    page.goto(console + "/dead")
    page.click("form[action='/dead/retry'] button")
    page.wait_for_selector(".flash")
    assert "2 dead" in page.inner_text(".flash")
    assert [status_of(conn, i) for i in dead] == ["ready", "ready"]

    page.goto(f"{console}/jobs?{urlencode({'status': 'ready', 'type': mail})}")
    page.fill("input[name=priority]", "7")
    page.click("text=set priority…")
    page.wait_for_selector("#bulk-count")
    assert page.inner_text("#bulk-count strong") == "2"
    page.click("form[action='/jobs/bulk'] button")
    page.wait_for_selector(".flash")
    priorities = conn.execute("SELECT priority FROM rota.job WHERE type = %s", [mail]).fetchall()
    assert [r["priority"] for r in priorities] == [7, 7]

    for verb in ("pause", "resume"):
        page.goto(console + "/types")
        page.click(f"tr[data-type='mail\\a out'] form[action='/types/{verb}'] button")
        page.wait_for_selector(".flash")
        paused = [r["type"] for r in conn.execute("SELECT type FROM rota.paused_type")]
        assert paused == ([mail] if verb == "pause" else []), verb
    page.goto(console + "/types")
    page.click("form[action='/types/limit/clear'] button")
    page.wait_for_selector(".flash")
    assert conn.execute("SELECT type FROM rota.job_limit").fetchall() == []

    for verb, suspended in (("suspend", True), ("resume", False)):
        page.goto(console + "/schedules")
        page.click(f"form[action='/schedules/{verb}'] button")
        page.wait_for_selector(".flash")
        assert schedule_store.get(conn, nightly)["suspend"] is suspended, verb
    audit = conn.execute("SELECT action, target FROM rota.audit").fetchall()
    targets = {r["action"]: r["target"] for r in audit}
    assert targets["retry-dead-group"]["type"] == mail
    assert targets["bulk-priority"]["filter"]["type"] == mail
    assert targets["pause"]["types"] == targets["resume"]["types"] == [mail]
    assert targets["clear-limit"]["type"] == limited
    assert targets["suspend"]["schedule"] == targets["resume-schedule"]["schedule"] == nightly
    assert refused == []
