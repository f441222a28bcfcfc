"""The overview's charts: axes of round numbers, gridlines, a tooltip per point,
ranges of 1 h, 24 h and 7 d, and a line per busy job type from the samples."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from rota import workers
from rota.web import charts
from tests.web.conftest import BEARER, HTML, add_job

END = datetime(2030, 3, 14, 15, 30, tzinfo=UTC)


def test_a_chart_has_round_y_ticks_time_labels_and_a_tooltip_per_point():
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
    assert len(c.hovers) == 61 and c.hovers[-1].text == "Thu 15:30 UTC: all types 0"
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
                " (date_trunc('minute', %s::timestamptz), %s, %s, 0, 0, 0)",
                [now - timedelta(minutes=minute), job_type, n * share],
            )


def test_the_overview_draws_each_range_with_a_line_per_type(client, conn):
    _samples(conn, 3 * 24 * 60, step=10)
    for name, points in (("1h", 6), ("24h", 144), ("7d", 72)):
        page = client.get("/", params={"range": name}, headers={**BEARER, **HTML}).text
        assert f'href="/?range={name}" class="active"' in page, name
        svg = page[page.index("<svg") : page.index("</svg>")]
        assert 'class="line s2"' in svg and 'class="line s3"' in svg, name  # email, sms
        assert abs(svg.count("<title>") - points) <= 2, (name, svg.count("<title>"))
        assert 'class="gridline"' in svg and 'class="axis-label"' in svg
        legend = re.findall(r'class="key k\d"></span>([^<]+)<', page)
        assert legend == ["all types", "email", "sms"], name
    assert client.get("/", params={"range": "2y"}, headers=BEARER).status_code == 400


def test_the_sample_is_recorded_per_type_too(conn):
    add_job(conn, "email", "ready")
    add_job(conn, "sms", "dead")
    assert workers.record_sample(conn)
    rows = conn.execute(
        "SELECT type, ready_due, ended_total FROM rota.queue_sample_type ORDER BY type"
    ).fetchall()
    assert [(r["type"], r["ready_due"], r["ended_total"]) for r in rows] == [
        ("email", 1, 0),
        ("sms", 0, 1),
    ]
