"""Cron parsing and slots, DST days included (no database)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from rota import cron
from rota.errors import InvalidInput

BERLIN = "Europe/Berlin"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def day_slots(expr: str, tz: str, start: datetime, end: datetime) -> list[str]:
    """Every slot in [start, end) as UTC ISO strings."""
    schedule = cron.Schedule(expr, tz)
    found, current = [], start - timedelta(seconds=1)
    while (current := schedule.next_slot(current)) is not None and current < end:  # type: ignore[assignment]
        found.append(current.isoformat())
    return found


def test_fields_and_macros() -> None:
    c = cron.parse("*/15 9-17 * jan,JUL mon-fri")
    assert c.minutes == (0, 15, 30, 45)
    assert c.hours == tuple(range(9, 18))
    assert c.months == {1, 7}
    assert c.weekdays == {1, 2, 3, 4, 5}
    hourly = cron.parse("@HOURLY")
    assert (hourly.minutes, hourly.hours) == ((0,), tuple(range(24)))
    assert cron.parse("0 0 * * 7").weekdays == {0}
    assert cron.parse("5/20 * * * *").minutes == (5, 25, 45)
    for macro in ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight"):
        cron.Schedule(macro)


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",
        "* * * * * *",
        "60 * * * *",
        "* 24 * * *",
        "*/0 * * * *",
        "5-1 * * * *",
        "a * * * *",
        "@reboot",
        "* * 0 * *",
        "1,,2 * * * *",
        "0 0 31 2 *",
        "L * * * *",
    ],
)
def test_invalid_expressions(expr: str) -> None:
    with pytest.raises(InvalidInput, match="cron expression"):
        cron.Schedule(expr)


def test_an_expression_is_at_most_1024_bytes_as_written() -> None:
    # The database refuses a longer text (migration 0037): Python does first.
    assert cron.parse("0" * 1016 + " * * * *").minutes == (0,)
    for longer in ("0" * 1017 + " * * * *", "* * * * *" + " " * 1016, "\u3000" * 342):
        with pytest.raises(InvalidInput, match=r"^cron expression is 10\d\d bytes long, over"):
            cron.Schedule(longer)


@pytest.mark.parametrize("name", ["Mars/Olympus", "", " UTC", "../etc/passwd", "/etc/localtime"])
def test_unknown_time_zone(name: str) -> None:
    with pytest.raises(InvalidInput, match="unknown time zone"):
        cron.zone(name)


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    schedule = cron.Schedule("0 0 13 * 5")  # the 13th, or any Friday
    slots = schedule.slots(utc(2026, 2, 1), 4)
    assert [s.date().isoformat() for s in slots] == [
        "2026-02-06",
        "2026-02-13",
        "2026-02-20",
        "2026-02-27",
    ]


@pytest.mark.parametrize("expr", ["0 0 ? * 1", "0 0 ? * mon", "0 0 ? * 1-1"])
def test_a_question_mark_restricts_no_day(expr: str) -> None:
    # As in Quartz's "0 0 ? * MON": Mondays only (it ran every day).
    slots = cron.Schedule(expr).slots(utc(2026, 1, 1), 3)
    assert [s.date().isoformat() for s in slots] == ["2026-01-05", "2026-01-12", "2026-01-19"]
    monthly = cron.Schedule("0 0 1 * ?").slots(utc(2026, 1, 1), 2)
    assert [s.date().isoformat() for s in monthly] == ["2026-02-01", "2026-03-01"]


@pytest.mark.parametrize(
    "expr",
    ["R * * * *", "r * * * *", "R(0-5) * * * *", "0 R * * *", "0 0 15W * *", "0 0 15w * *",
     "0 0 1,15W * *", "0 0 1-15W * *", "0 0 * * 1/R"],
)  # fmt: skip
def test_random_values_and_nearest_weekdays_are_refused(expr: str) -> None:
    # R drew a new value at each parse, so the slots moved between two ticks of
    # the scheduler; 15W (the weekday nearest the 15th) ran on the 15th.
    with pytest.raises(InvalidInput, match="is not classic cron"):
        cron.Schedule(expr)


@pytest.mark.parametrize("expr", ["0 0 * * 5#2", "0 0 * * mon#1", "0 0 1 * 1#3"])
def test_a_nth_weekday_is_refused_in_the_day_of_week_field(expr: str) -> None:
    with pytest.raises(InvalidInput, match="day of week field is not classic cron"):
        cron.Schedule(expr)


@pytest.mark.parametrize(
    ("expr", "weekdays"),
    [
        # a/n runs from a to the field's end, 7 (Sunday) included, as a-7/n does.
        ("0 0 * * 1/2", {1, 3, 5, 0}),
        ("0 0 * * mon/2", {1, 3, 5, 0}),
        ("0 0 * * 1-7/2", {1, 3, 5, 0}),
        ("0 0 * * 5/2", {5, 0}),
        ("0 0 * * 0/2", {0, 2, 4, 6}),
        ("0 0 * * 6/1", {6, 0}),
        ("0 0 * * 7/3", {0}),
        ("0 0 * * 2/3,4", {2, 5, 4}),
        ("0 0 * * */2", {0, 2, 4, 6}),
    ],
)
def test_a_step_from_one_weekday_runs_to_sunday_as_seven(expr: str, weekdays: set[int]) -> None:
    assert cron.parse(expr).weekdays == weekdays


def test_next_slot_is_strictly_after() -> None:
    schedule = cron.Schedule("*/5 * * * *")
    assert schedule.next_slot(utc(2026, 1, 1, 10, 5)) == utc(2026, 1, 1, 10, 10)
    assert schedule.next_slot(utc(2026, 1, 1, 10, 4, 59)) == utc(2026, 1, 1, 10, 5)


def test_spring_forward_fixed_hour_runs_once_after_the_gap() -> None:
    slots = day_slots("30 2 * * *", BERLIN, utc(2026, 3, 28, 0), utc(2026, 3, 31, 0))
    # 02:30 CET on the 28th, 03:00 CEST (first valid instant) on the 29th, 02:30 CEST on the 30th
    assert slots == [
        "2026-03-28T01:30:00+00:00",
        "2026-03-29T01:00:00+00:00",
        "2026-03-30T00:30:00+00:00",
    ]


def test_spring_forward_hourly_has_23_slots() -> None:
    slots = day_slots("0 * * * *", BERLIN, utc(2026, 3, 28, 23), utc(2026, 3, 29, 22))
    expected = [utc(2026, 3, 28, 23), utc(2026, 3, 29, 0)]
    expected += [utc(2026, 3, 29, h) for h in range(1, 22)]
    assert slots == [s.isoformat() for s in expected]
    assert len(slots) == 23


def test_fall_back_fixed_hour_runs_once_at_first_occurrence() -> None:
    slots = day_slots("30 2 * * *", BERLIN, utc(2026, 10, 24, 0), utc(2026, 10, 27, 0))
    assert slots == [
        "2026-10-24T00:30:00+00:00",
        "2026-10-25T00:30:00+00:00",  # 02:30 CEST, not again at 02:30 CET
        "2026-10-26T01:30:00+00:00",
    ]


def test_fall_back_hourly_runs_once_per_real_hour() -> None:
    slots = day_slots("0 * * * *", BERLIN, utc(2026, 10, 24, 22), utc(2026, 10, 25, 23))
    assert slots == [utc(2026, 10, 24, 22).isoformat(), utc(2026, 10, 24, 23).isoformat()] + [
        utc(2026, 10, 25, h).isoformat() for h in range(0, 23)
    ]
    assert len(slots) == 25
    local = [cron.preview("0 * * * *", BERLIN, utc(2026, 10, 24, 23, 30), 3)]
    assert [s.isoformat() for s in local[0]] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


def test_fixed_hour_minutes_in_gap_make_one_run() -> None:
    slots = day_slots("*/15 2 * * *", BERLIN, utc(2026, 3, 29, 0), utc(2026, 3, 29, 2))
    assert slots == ["2026-03-29T01:00:00+00:00"]


def test_due_counts_and_latest() -> None:
    schedule = cron.Schedule("0 * * * *")
    count, latest = schedule.due(utc(2026, 1, 1, 10), utc(2026, 1, 1, 12, 30))
    assert (count, latest) == (3, utc(2026, 1, 1, 12))
    assert schedule.due(utc(2026, 1, 1, 10, 1), utc(2026, 1, 1, 10, 59)) == (0, None)
    count, _ = cron.Schedule("* * * * *").due(utc(2025, 1, 1), utc(2025, 12, 31, 23, 59))
    assert count == 365 * 1440


def test_due_counts_an_instant_two_days_share_once() -> None:
    # Samoa skipped 2011-12-30: that day's midnight, moved to the next valid
    # instant, is the 31st's own midnight. The catch-up count saw two slots
    # there and the scheduler counted one as missed.
    schedule = cron.Schedule("@daily", "Pacific/Apia")
    midnight = utc(2011, 12, 30, 10)
    assert schedule.due(utc(2011, 12, 30, 9), utc(2011, 12, 30, 11)) == (1, midnight)
    assert schedule.slots(utc(2011, 12, 29, 11), 2) == [midnight, utc(2011, 12, 31, 10)]


def test_preview_in_the_schedule_zone() -> None:
    slots = cron.preview("@daily", "America/New_York", utc(2026, 3, 7, 12), 2)
    assert [s.isoformat() for s in slots] == [
        "2026-03-08T00:00:00-05:00",
        "2026-03-09T00:00:00-04:00",
    ]


def test_a_day_of_minutes_is_fast() -> None:
    schedule = cron.Schedule("* * * * *", BERLIN)
    started = time.monotonic()
    assert len(schedule.slots(utc(2027, 1, 1), 1440)) == 1440
    assert time.monotonic() - started < 2
