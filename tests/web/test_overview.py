"""An overview an operator can trust: it never says "nothing needs you" while
jobs are dead, failed or retrying, it names that work by type with counts, it
draws the failed attempts per minute, and its table and its charts mean the
same jobs by "ready" (ready jobs whose run_at has come)."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rota import sql, workers
from rota.db import fetch_all
from rota.web import overview
from tests.web.conftest import BEARER, HTML, add_job

PAGE = {**BEARER, **HTML}
NOW = datetime(2030, 3, 14, 15, 30, 20, tzinfo=UTC)


def warnings_of(page: str) -> str:
    start = page.index('id="warnings"')
    return html.unescape(re.sub(r"<[^>]+>", " ", page[start : page.index("</ul>", start)]))


@pytest.mark.parametrize(
    "trouble, named",
    [
        ({"status": "dead", "attempts": 5, "max_attempts": 5}, "2 dead mail job(s)"),
        ({"status": "failed", "attempts": 1}, "2 failed mail job(s) (a permanent error)"),
        (
            {"status": "ready", "attempts": 10, "max_attempts": 12},
            "2 mail job(s) retrying after an error (furthest: 10 of 12 attempts)",
        ),
    ],
)
def test_never_all_clear_while_jobs_are_dead_failed_or_retrying(client, conn, trouble, named):
    workers.register(conn, workers.WorkerInfo("w1", concurrency=1, types=("mail",)))
    late = datetime.now(UTC) + timedelta(minutes=5)
    for _ in range(2):
        add_job(conn, "mail", last_error="SMTPError: 451", run_at=late, **trouble)
    page = client.get("/", headers=PAGE).text
    assert "Nothing needs you" not in page
    assert named in warnings_of(page)
    conn.execute("DELETE FROM rota.job")
    assert "Nothing needs you" in client.get("/", headers=PAGE).text


def write_outcome(conn: Any, job_id: int, outcome: str, error: str | None, now: datetime) -> None:
    """A worker's outcome for a running job, written by the worker's own statement."""
    fetch_all(conn, sql.query("write_outcomes"), {
        "ids": [job_id], "claims": [1], "outcomes": [outcome], "delays": [30.0],
        "errors": [error], "results": None, "worker": "w1", "now": now,
    })  # fmt: skip


def running(conn: Any, job_type: str = "mail") -> int:
    return add_job(conn, job_type, "running", attempts=1, claims=1, locked_by="w1", started_at=NOW)


def test_every_failed_attempt_is_counted_by_minute_and_type_and_nothing_else(conn):
    write_outcome(conn, running(conn), "retry", "SMTPError: 451", NOW)
    write_outcome(conn, running(conn), "failed", "KeyError: 'to'", NOW)
    write_outcome(conn, running(conn, "sms"), "retry", "Timeout", NOW + timedelta(minutes=1))
    write_outcome(conn, running(conn), "done", None, NOW)
    write_outcome(conn, running(conn), "released", "Released: worker shut down", NOW)
    write_outcome(conn, running(conn), "cancelled", "Cancelled: by request", NOW)
    rows = conn.execute(
        "SELECT minute, type, sum(count) AS n FROM rota.job_failure_count GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    minute = NOW.replace(second=0)
    assert [(r["minute"], r["type"], r["n"]) for r in rows] == [
        (minute, "mail", 2),
        (minute + timedelta(minutes=1), "sms", 1),
    ]
    # The minute's sample folds them into one row per minute and type.
    workers.record_sample(conn, now=NOW + timedelta(minutes=2))
    assert conn.execute("SELECT count(*) AS n FROM rota.job_failure_count").fetchone()["n"] == 2


def test_failed_attempts_per_minute_by_type_on_the_overview(client, conn):
    now = datetime.now(UTC)
    for minutes_ago, job_type in ((3, "mail"), (3, "mail"), (2, "mail"), (2, "sms")):
        write_outcome(
            conn, running(conn, job_type), "retry", "E", now - timedelta(minutes=minutes_ago)
        )
    found = overview.read(conn)
    assert found.failures is not None
    assert [line.name for line in found.failures.lines] == ["all types", "mail", "sms"]
    assert found.failures.peak == 2.0
    assert found.failing == {"mail": 3, "sms": 1}
    page = client.get("/", headers=PAGE).text
    assert 'id="chart-failed-attempts-per-minute"' in page
    assert "3 mail attempt(s) failed in the last 10 minutes" in warnings_of(page)


def test_the_table_and_the_chart_mean_due_jobs_by_ready(client, conn):
    workers.register(conn, workers.WorkerInfo("w1", concurrency=1, types=("mail", "sms")))
    now = datetime.now(UTC)
    for _ in range(3):  # waiting for their next attempt, not due yet
        add_job(conn, "mail", attempts=2, run_at=now + timedelta(minutes=10))
    add_job(conn, "sms", run_at=now - timedelta(seconds=90))  # due for 90 s
    workers.record_sample(conn, now=now - timedelta(minutes=1))
    workers.record_sample(conn)
    found = overview.read(conn)
    assert found.status.types["mail"].due == 0
    page = client.get("/", headers=PAGE).text
    row = {
        t: re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)
        for t, r in re.findall(r'<tr data-type="([^"]+)">(.*?)</tr>', page, re.S)
    }
    head = re.findall(r"<th[^>]*>(.*?)</th>", page[page.index('id="types"') :].split("</thead>")[0])
    mail = dict(zip(head, (re.sub(r"<[^>]+>", "", c).strip() for c in row["mail"]), strict=True))
    sms = dict(zip(head, (re.sub(r"<[^>]+>", "", c).strip() for c in row["sms"]), strict=True))
    # Mail's jobs are not ready (not due): neither the table nor the chart shows an age.
    assert (mail["Ready"], mail["Oldest ready"], mail["Later"], mail["Retrying"]) == (
        "0",
        "-",
        "3",
        "3",
    )
    assert (sms["Ready"], sms["Later"]) == ("1", "0")
    assert sms["Oldest ready"].startswith("1m")
    # The chart draws the one due job's wait, and no line for mail.
    assert [line.name for line in found.queue_age.lines] == ["all types", "sms"]
    assert found.queue_age.latest is not None and 90 <= found.queue_age.latest < 150


def test_waiting_jobs_have_their_own_figure_and_show_when_they_wake(client, conn):
    later = datetime.now(UTC) + timedelta(hours=2)
    for _ in range(2):
        add_job(conn, "order", "waiting", run_at=later)
    add_job(conn, "order", "ready")
    page = client.get("/", headers=PAGE).text
    head = re.findall(r"<th[^>]*>(.*?)</th>", page[page.index('id="types"') :].split("</thead>")[0])
    [row] = re.findall(r'<tr data-type="order">(.*?)</tr>', page, re.S)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td.*?>(.*?)</td>", row, re.S)]
    order = dict(zip(head, cells, strict=True))
    assert (order["Waiting"], order["Ready"], order["Running"]) == ("2", "1", "0")
    assert "/jobs?status=waiting&amp;type=order" in row
    listed = client.get("/jobs?status=waiting", headers=PAGE).text
    assert "ended" not in listed
    assert len(re.findall(r"wakes\s*<time", listed)) == 2
