"""Every page of the console as a person sees it, in a real headless Chromium:
nothing wider than a 390 px phone, the actions on screen, text shown as text, a
job waiting for its next attempt called "retrying", and an overview that never
says all is well while jobs die. With ROTA_WEB_SCREENSHOTS=1 (`make
web-screenshots`) it also photographs every page at 1440x900, on a 390 px phone
and in the dark scheme into docs/screenshots/."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from rota import sql
from rota.db import fetch_all
from tests.web import test_browser as shared
from tests.web.conftest import add_job
from tests.web.test_browser import DOCS, _log_in, _page, seed

console = shared.console  # the same fixtures: a served console, a Chromium
browser = shared.browser

LONG_TOKEN = "ValidationError: " + "x" * 40 + "/" + "abcdef0123456789" * 30
PAGES = ("/", "/jobs", "/dead", "/schedules", "/types", "/workers", "/audit")


def seed_more(conn: Any) -> dict[str, int]:
    """The browser test's queue, and what a bad night adds to it."""
    ids = seed(conn)
    now = datetime.now(UTC)
    ids["muller"] = add_job(
        conn, "invoice", "ready", payload=Jsonb({"customer": "Müller & Söhne", "note": "<b>x</b>"})
    )
    ids["retrying"] = add_job(
        conn, "report", "ready", attempts=10, max_attempts=12, run_at=now + timedelta(minutes=4),
        last_error="ConnectionError: the warehouse did not answer",
    )  # fmt: skip
    ids["recovered"] = add_job(
        conn, "mail", "done", attempts=2, last_error="SMTPError: 451 try again later",
        finished_at=now - timedelta(minutes=1),
    )  # fmt: skip
    ids["long"] = add_job(
        conn, "import", "dead", attempts=3, max_attempts=3, last_error=LONG_TOKEN,
        payload=Jsonb({"file": "s3://bucket/" + "very-long-segment-" * 12}),
        finished_at=now - timedelta(minutes=2),
    )  # fmt: skip
    for minutes_ago in (9, 6, 6, 2):
        failed = add_job(
            conn, "mail", "running", attempts=1, claims=1, locked_by="w1", started_at=now
        )
        fetch_all(conn, sql.query("write_outcomes"), {
            "ids": [failed], "claims": [1], "outcomes": ["retry"], "delays": [600.0],
            "errors": ["SMTPError: 451"], "results": None, "worker": "w1",
            "now": now - timedelta(minutes=minutes_ago),
        })  # fmt: skip
    return ids


def _shots() -> Path | None:
    if os.environ.get("ROTA_WEB_SCREENSHOTS") != "1":
        return None
    folder = DOCS / "screenshots"
    folder.mkdir(exist_ok=True)
    return folder


def _name(path: str) -> str:
    return {"/": "overview", "/jobs/DEAD": "job"}.get(path, path.strip("/").replace("/", "-"))


def test_no_page_is_wider_than_a_phone_and_every_action_is_on_screen(console, browser, conn):
    ids = seed_more(conn)
    refused: list[str] = []
    shots = _shots()
    phone = _page(
        browser, refused, viewport={"width": 390, "height": 844}, device_scale_factor=1,
        is_mobile=True, has_touch=True,
    )  # fmt: skip
    _log_in(phone, console)
    jobs = [f"/jobs/{ids[name]}" for name in ("running", "long", "muller", "retrying")]
    paths = [*PAGES, "/jobs/DEAD", *jobs, "/jobs?status=dead", "/jobs/bulk?action=retry"]
    for path in paths:
        phone.goto(console + path.replace("DEAD", str(ids["dead"])))
        wide = phone.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, (path, wide)
        if shots and (path in PAGES or path == "/jobs/DEAD"):
            phone.screenshot(path=str(shots / f"phone-{_name(path)}.png"))
    # On the phone, each dead-letter group's Retry button and its sample error are
    # on screen, and so is each type's Pause button.
    for path, buttons in (("/types", "#type-list button"), ("/dead", "#dead button")):
        phone.goto(console + path)
        for button in phone.locator(buttons).all():
            box = button.bounding_box()
            assert box is not None and box["x"] + box["width"] <= 390, (path, box)
    sample = phone.locator("#dead tr.sample", has_text="ValidationError").bounding_box()
    assert sample is not None and sample["x"] >= 0 and sample["x"] + sample["width"] <= 390
    assert refused == []


def test_every_page_on_a_wide_screen_and_in_the_dark(console, browser, conn):
    ids = seed_more(conn)
    refused: list[str] = []
    shots = _shots()
    wide = _page(browser, refused, viewport={"width": 1440, "height": 900})
    _log_in(wide, console)

    # The overview names the trouble by type and never says all is well meanwhile.
    warnings = wide.inner_text("#warnings")
    assert "Nothing needs you" not in warnings
    for named in ("5 dead mail job(s)", "2 failed invoice job(s)", "1 dead import job(s)",
                  "1 report job(s) retrying after an error (furthest: 10 of 12 attempts)",
                  "4 mail attempt(s) failed in the last 10 minutes"):  # fmt: skip
        assert named in warnings, (named, warnings)
    assert wide.locator("#chart-failed-attempts-per-minute polyline").count() >= 1

    # Dead letters: an unbroken error 500 characters long leaves every Retry on screen.
    wide.goto(console + "/dead")
    assert wide.evaluate("document.documentElement.scrollWidth") <= 1440
    for button in wide.locator("#dead button").all():
        box = button.bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1440, box

    # A payload is its text, not JSON escapes.
    wide.goto(f"{console}/jobs/{ids['muller']}")
    payload = wide.inner_text("pre.payload")
    assert '"customer": "Müller & Söhne"' in payload and '"note": "<b>x</b>"' in payload

    # A job waiting for its next attempt says so, and the filter finds it.
    wide.goto(console + "/jobs")
    row = wide.locator("#jobs tbody tr", has=wide.locator(f"a:text-is('{ids['retrying']}')"))
    assert row.locator(".status").inner_text() == "retrying"
    wide.select_option("select[name=status]", "retrying")
    wide.click("#filter button[type=submit]")
    wide.wait_for_url("**status=retrying*")
    statuses = wide.locator("#jobs tbody .status").all_inner_texts()
    assert statuses == ["retrying"] * 5  # the report job and four mail jobs

    # Errors are searched by their text; a job that recovered is not red.
    wide.goto(console + "/jobs")
    wide.fill("input[name=error]", "smtperror: 451 TRY")
    wide.click("#filter button[type=submit]")
    wide.wait_for_url("**error=*")
    found = wide.locator("#jobs tbody tr")
    assert found.count() == 1
    recovered = found.locator("td").last.locator("span")
    red = wide.evaluate("getComputedStyle(document.querySelector('.s-dead')||document.body).color")
    assert recovered.evaluate("e => getComputedStyle(e).color") != red

    if shots:
        for path in (*PAGES, "/jobs/DEAD"):
            wide.goto(console + path.replace("DEAD", str(ids["dead"])))
            wide.screenshot(path=str(shots / f"wide-{_name(path)}.png"))
        dark = _page(browser, refused, viewport={"width": 1440, "height": 900}, color_scheme="dark")
        _log_in(dark, console)
        for path in (*PAGES, "/jobs/DEAD"):
            dark.goto(console + path.replace("DEAD", str(ids["dead"])))
            dark.screenshot(path=str(shots / f"dark-{_name(path)}.png"))
    assert refused == []
