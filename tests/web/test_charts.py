"""The overview's charts: axes of round numbers, gridlines, a readout per point,
ranges of 1 h, 24 h and 7 d, and a line per job type from the per-type samples
(the busiest types' throughput, the queue age of the types that waited longest)."""

from __future__ import annotations

import html
import itertools
import json
import re
from datetime import UTC, datetime, timedelta

from rota import workers
from rota.web import charts, overview
from tests.web.conftest import BEARER, HTML, add_job

END = datetime(2030, 3, 14, 15, 30, tzinfo=UTC)
THROUGHPUT = "chart-jobs-finished-per-minute"
QUEUE_AGE = "chart-oldest-ready-job-s-age-seconds"


def test_a_chart_has_round_y_ticks_time_labels_and_a_readout_per_point():
    points = [(END - timedelta(minutes=m), float(m % 7)) for m in range(60, -1, -1)]
    c = charts.chart("Jobs", {"all types": points, "email": points[:10]}, END, charts.RANGES["1h"])
    assert [label for _, label in c.y_ticks] == ["0", "2", "4", "6", "8"]  # peak 6 -> 8
    assert [label for _, label in c.x_ticks] == [
        "14:30",
        "14:40",
        "14:50",
        "15:00",
        "15:10",
        "15:20",
        "15:30",
    ]
    assert len(c.columns) == 61
    assert c.columns[-1].text == "Thu 14 Mar 15:30 UTC: all types 0"  # email ended at 14:39
    assert c.columns[0].text == "Thu 14 Mar 14:30 UTC: all types 4, email 4"
    # The readout: each line's value as shown and its height, at the middle of its strip.
    first = c.columns[0]
    assert json.loads(first.readout) == [["4", 93.0], ["4", 93.0]]
    assert first.x + first.width / 2 == charts.LEFT
    assert json.loads(c.columns[-1].readout) == [["0", 178.0], None]
    assert json.loads(c.legend) == [["all types", "s1"], ["email", "s2"]]
    assert c.slug == "chart-jobs"
    assert [line.css for line in c.lines] == ["s1", "s2"]
    assert charts.chart("Jobs", {"all types": points[:1]}, END, charts.RANGES["1h"]).empty


def test_the_y_axis_has_four_round_steps():
    assert [charts.axis_top(v) for v in (0, 0.3, 1, 6, 7, 11, 240, 2600)] == [
        4,
        0.4,
        1,
        8,
        8,
        20,
        400,
        4000,
    ]


def _samples(conn, minutes: int, step: int = 1) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    now -= timedelta(minutes=now.minute % step)  # samples on the buckets' first minutes
    for n, minute in enumerate(range(minutes, -1, -step)):
        conn.execute(
            "INSERT INTO rota.queue_sample VALUES"
            " (date_trunc('minute', %s::timestamptz), %s, 0, 1, 0, 5)",
            [now - timedelta(minutes=minute), n * 10],
        )
        for job_type, share in (("email", 7), ("sms", 3)):
            conn.execute(
                "INSERT INTO rota.queue_sample_type VALUES"
                " (date_trunc('minute', %s::timestamptz), %s, %s, 0, 0, 0, %s)",
                [now - timedelta(minutes=minute), job_type, n * share, share],
            )


def test_the_overview_draws_each_range_with_a_line_per_type(client, conn):
    _samples(conn, 3 * 24 * 60, step=10)
    for name, points in (("1h", 6), ("24h", 144), ("7d", 72)):
        page = client.get("/", params={"range": name}, headers={**BEARER, **HTML}).text
        assert f'href="/?range={name}" class="active"' in page, name
        svg = page[page.index("<svg") : page.index("</svg>")]
        assert 'class="line s2"' in svg and 'class="line s3"' in svg, name  # email, sms
        columns = svg.count('<rect class="hover"')
        assert abs(columns - points) <= 2, (name, columns)
        assert svg.count("data-values=") == columns and "<title>" not in svg
        assert 'class="gridline"' in svg and 'class="axis-label"' in svg
        charts_at = [page.index(f'id="{slug}"') for slug in (THROUGHPUT, QUEUE_AGE)]
        for start, end in itertools.pairwise([*charts_at, len(page)]):
            legend = re.findall(r'class="key k\d"></span>([^<]+)<', page[start:end])
            assert legend == ["all types", "email", "sms"], name  # email waited longest
    assert client.get("/", params={"range": "2y"}, headers=BEARER).status_code == 400


def test_the_sample_is_recorded_per_type_too(conn):
    now = datetime.now(UTC)
    add_job(conn, "email", "ready", run_at=now - timedelta(seconds=90))
    add_job(conn, "email", "ready", run_at=now - timedelta(seconds=30))
    add_job(conn, "email", "ready", run_at=now + timedelta(hours=1))  # not due: not late
    add_job(conn, "sms", "dead")
    assert workers.record_sample(conn, now=now)
    rows = conn.execute(
        "SELECT type, ready_due, ended_total, oldest_ready_age_seconds"
        " FROM rota.queue_sample_type ORDER BY type"
    ).fetchall()
    assert [tuple(r.values()) for r in rows] == [("email", 2, 0, 90.0), ("sms", 0, 1, 0.0)]


def test_the_queue_age_chart_has_a_line_per_type_that_waited(client, conn):
    """The age of each type's oldest due job: the types that waited longest, the
    idle ones left out, samples from before the per-type age (NULL) as gaps."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    ages = {"email": 40.0, "sms": 0.0, "report": 300.0}
    for minute in range(30, -1, -1):
        at = now - timedelta(minutes=minute)
        conn.execute(
            "INSERT INTO rota.queue_sample VALUES (%s, 0, 0, 1, 0, %s)", [at, max(ages.values())]
        )
        for job_type, age in ages.items():
            conn.execute(
                "INSERT INTO rota.queue_sample_type VALUES (%s, %s, 0, 0, 1, 0, %s)",
                [at, job_type, None if job_type == "email" and minute > 20 else age],
            )
    o = overview.read(conn)
    assert [line.name for line in o.queue_age.lines] == ["all types", "report", "email"]
    last = o.queue_age.columns[-1]
    assert last.text.endswith(": all types 300, report 300, email 40")
    early = next(c for c in o.queue_age.columns if c.at == now - timedelta(minutes=25))
    assert early.values[2] is None and early.text.endswith(": all types 300, report 300")
    page = client.get("/", headers={**BEARER, **HTML}).text
    age_chart = page[page.index(f'id="{QUEUE_AGE}"') :]
    legend = re.findall(r'class="key k\d"></span>([^<]+)<', age_chart)
    assert legend == ["all types", "report", "email"]


def test_a_type_name_reaches_the_readout_as_text_only(client, conn):
    """console.js puts the names in the tooltip with textContent; the page carries
    them escaped inside the chart's data-lines attribute, never as markup."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    name = '<img src=x onerror="alert(1)">'
    for minute in range(5, -1, -1):
        at = now - timedelta(minutes=minute)
        conn.execute("INSERT INTO rota.queue_sample VALUES (%s, %s, 0, 1, 0, 9)", [at, minute])
        conn.execute(
            "INSERT INTO rota.queue_sample_type VALUES (%s, %s, %s, 0, 1, 0, 9)",
            [at, name, 10 - minute],
        )
    page = client.get("/", headers={**BEARER, **HTML}).text
    assert "<img" not in page
    lines = re.search(r'data-lines="([^"]*)"', page)
    assert lines is not None and "&lt;img" in lines.group(1)
    assert [n for n, _ in json.loads(html.unescape(lines.group(1)))] == ["all types", name]
