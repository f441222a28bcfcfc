"""Cron and DST as properties: random expressions, IANA zones and dates, against invariants.

The expressions are generated from their parts, so the test knows each field's
allowed values without parsing the text. The oracle is a brute-force matcher:
every UTC minute of a window, turned into local time and matched field by field,
with the DST rules of rota/cron.py written out the plain way (fall-back: a
fixed-hour time only at its first occurrence; spring-forward: a fixed-hour time
in the gap once, at the first instant after it; wildcard-hour: every real
minute whose wall time matches). On a loaded machine there is no deadline, and
the examples are derandomized so every run (CI included) tries the same ones.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rota import cron
from rota.errors import InvalidInput

PROPERTY = settings(
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=int(os.environ.get("ROTA_PROPERTY_EXAMPLES") or 150),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
MINUTE, HOUR = timedelta(minutes=1), timedelta(hours=1)
# Zones whose rules are out of the ordinary: 30-minute and 2-hour shifts,
# negative DST, gaps across midnight, a skipped day, odd fixed offsets.
CURIOUS = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Antarctica/Troll",
    "Europe/Dublin",
    "Africa/Casablanca",
    "America/Havana",
    "America/Santiago",
    "America/Asuncion",
    "Asia/Beirut",
    "Pacific/Apia",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "America/St_Johns",
    "UTC",
]
ZONES = sorted(available_timezones())
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
FIELDS = [(0, 59, []), (0, 23, []), (1, 31, []), (1, 12, MONTHS), (0, 7, DAYS)]


@dataclasses.dataclass(frozen=True)
class Expr:
    """A generated expression: its text and each field's allowed values."""

    text: str
    values: tuple[frozenset[int], ...]
    restricted: tuple[bool, ...]  # the field does not start with '*'

    @property
    def weekdays(self) -> frozenset[int]:
        return frozenset(0 if d == 7 else d for d in self.values[4])

    @property
    def wildcard_hour(self) -> bool:
        return len(self.values[1]) == 24

    def matches_day(self, day: date) -> bool:
        if day.month not in self.values[3]:
            return False
        in_days = day.day in self.values[2]
        in_weekdays = (day.isoweekday() % 7) in self.weekdays
        if self.restricted[2] and self.restricted[4]:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def matches(self, wall: datetime) -> bool:
        return (
            wall.minute in self.values[0]
            and wall.hour in self.values[1]
            and self.matches_day(wall.date())
        )


def _value(draw: st.DrawFn, low: int, high: int, names: list[str]) -> tuple[str, int]:
    """A value in [low, high], sometimes by its name (names[0] stands for the field's lowest)."""
    number = draw(st.integers(low, high))
    first = 1 if names is MONTHS else 0
    if names and number - first < len(names) and draw(st.booleans()):
        return names[number - first], number
    return str(number), number


@st.composite
def field(draw: st.DrawFn, low: int, high: int, names: list[str]) -> tuple[str, frozenset[int]]:
    def part() -> tuple[str, set[int]]:
        kind = draw(st.sampled_from(["value", "range", "range/step", "start/step"]))
        a_text, a = _value(draw, low, high, names)
        if kind == "value":
            return a_text, {a}
        if kind == "start/step":
            step = draw(st.integers(1, high - low + 1))
            return f"{a}/{step}", set(range(a, high + 1, step))  # 5/1: Friday to Sunday (7)
        b_text, b = _value(draw, a, high, names)
        if kind == "range":
            return f"{a_text}-{b_text}", set(range(a, b + 1))
        step = draw(st.integers(1, high - low + 1))
        return f"{a_text}-{b_text}/{step}", set(range(a, b + 1, step))

    kind = draw(st.sampled_from(["*", "*/step", "list"]))
    if kind == "*":
        return "*", frozenset(range(low, high + 1))
    if kind == "*/step":
        step = draw(st.integers(1, high - low + 1))
        return f"*/{step}", frozenset(range(low, high + 1, step))
    parts = [part() for _ in range(draw(st.integers(1, 3)))]
    return ",".join(t for t, _ in parts), frozenset(v for _, vs in parts for v in vs)


@st.composite
def expressions(draw: st.DrawFn, hour: str | None = None) -> Expr:
    texts, values = [], []
    for i, (low, high, names) in enumerate(FIELDS):
        if i == 4 and values[2] == frozenset(range(1, 32)) and draw(st.booleans()):
            text, allowed = "*", frozenset(range(0, 8))  # most real schedules: any weekday
        else:
            text, allowed = draw(field(low, high, names))
        if i == 1 and hour == "wildcard":
            text, allowed = draw(st.sampled_from(["*", "*/1", "0-23"])), frozenset(range(24))
        elif i == 1 and hour == "fixed":
            assume(len(allowed) < 24)
        texts.append(text)
        values.append(allowed)
    restricted = tuple(not t.startswith("*") for t in texts)
    return Expr(" ".join(texts), tuple(values), restricted)


@functools.lru_cache(maxsize=2048)
def transitions(zone: str, year: int) -> tuple[datetime, ...]:
    """The instants (to the minute) in this year where the zone's UTC offset changes."""
    tz = ZoneInfo(zone)
    found, t = [], datetime(year, 1, 1, tzinfo=UTC)
    offset = t.astimezone(tz).utcoffset()
    while t.year == year:
        nxt = t + HOUR
        if nxt.astimezone(tz).utcoffset() != offset:
            m = t
            while m.astimezone(tz).utcoffset() == offset:
                m += MINUTE
            found.append(m)
            offset = nxt.astimezone(tz).utcoffset()
        t = nxt
    return tuple(found)


@st.composite
def windows(draw: st.DrawFn) -> tuple[str, datetime]:
    """A zone and the start of a 2-day window, often around one of its DST transitions."""
    zone = draw(st.one_of(st.sampled_from(CURIOUS), st.sampled_from(ZONES)))
    year = draw(st.integers(2000, 2037))
    changes = transitions(zone, year)
    if changes and draw(st.booleans()):
        centre = draw(st.sampled_from(changes))
    else:
        centre = datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=draw(st.integers(0, 364)))
    return zone, centre - timedelta(minutes=draw(st.integers(0, 1439)))


def brute_force(expr: Expr, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """The slots in [start, end), minute by minute (the oracle)."""
    tz = ZoneInfo(zone)
    found: set[datetime] = set()
    t = start.replace(second=0, microsecond=0)
    if t < start:
        t += MINUTE
    previous = (t - MINUTE).astimezone(tz)
    while t < end:
        local = t.astimezone(tz)
        if expr.matches(local) and (expr.wildcard_hour or local.fold == 0):
            found.add(t)
        jump = local.utcoffset() - previous.utcoffset()  # type: ignore[operator]
        if not expr.wildcard_hour and jump > timedelta(0):
            # Spring forward: the skipped wall times run once, now.
            skipped = previous.replace(tzinfo=None) + MINUTE
            while skipped < local.replace(tzinfo=None):
                if expr.matches(skipped):
                    found.add(t)
                    break
                skipped += MINUTE
        previous = local
        t += MINUTE
    return sorted(found)


def rota_slots(schedule: cron.Schedule, start: datetime, end: datetime) -> list[datetime]:
    found, current = [], start - timedelta(microseconds=1)
    while (nxt := schedule.next_slot(current)) is not None and nxt < end:
        found.append(nxt)
        current = nxt
    return found


def fires_ever(expr: Expr) -> bool:
    return any(
        expr.matches_day(date(2000, 1, 1) + timedelta(days=d)) for d in range(cron._SEARCH_DAYS)
    )


def schedule_of(expr: Expr, zone: str) -> cron.Schedule:
    try:
        return cron.Schedule(expr.text, zone)
    except InvalidInput as exc:
        assert "never fires" in str(exc), exc
        assert not fires_ever(expr), f"{expr.text!r} was refused but fires"
        assume(False)
        raise


@PROPERTY
@given(expressions(), windows())
def test_slots_are_exactly_those_of_a_minute_by_minute_matcher(
    expr: Expr, window: tuple[str, datetime]
) -> None:
    zone, start = window
    schedule = schedule_of(expr, zone)
    parsed = schedule.cron
    assert (set(parsed.minutes), set(parsed.hours)) == (expr.values[0], expr.values[1])
    assert (parsed.days, parsed.months, parsed.weekdays) == (
        expr.values[2],
        expr.values[3],
        expr.weekdays,
    )
    end = start + timedelta(days=2)
    assert rota_slots(schedule, start, end) == brute_force(expr, zone, start, end)


@PROPERTY
@given(expressions(), windows(), st.integers(1, 40))
def test_slots_strictly_increase_are_whole_minutes_and_agree_with_due(
    expr: Expr, window: tuple[str, datetime], count: int
) -> None:
    zone, start = window
    schedule = schedule_of(expr, zone)
    slots = schedule.slots(start, count)
    assert slots and slots[0] > start
    assert all(a < b for a, b in itertools.pairwise(slots))
    assert all(s.second == 0 and s.microsecond == 0 for s in slots)
    assert all(schedule.next_slot(a) == b for a, b in itertools.pairwise(slots))
    # The scheduler's catch-up count sees the same slots.
    assert schedule.due(slots[0], slots[-1]) == (len(slots), slots[-1])


@PROPERTY
@given(st.integers(0, 59), st.integers(0, 23), windows())
def test_a_daily_time_runs_once_per_local_day(
    minute: int, hour: int, window: tuple[str, datetime]
) -> None:
    zone, start = window
    tz = ZoneInfo(zone)
    schedule = cron.Schedule(f"{minute} {hour} * * *", zone)
    first = start.astimezone(tz).date() + timedelta(days=1)
    days = [first + timedelta(days=i) for i in range(40)]
    begin = datetime.combine(days[0], datetime.min.time(), tz).astimezone(UTC)
    finish = datetime.combine(days[-1], datetime.min.time(), tz).astimezone(UTC)
    slots = rota_slots(schedule, begin, finish)
    per_day = Counter(s.astimezone(tz).date() for s in slots)
    skipped_day = [d for d in days[:-1] if not _day_exists(d, tz)]  # e.g. Pacific/Apia 2011-12-30
    assume(not skipped_day)
    assert per_day == Counter(days[:-1]), (zone, [str(s) for s in slots])
    for slot in slots:
        wall = slot.astimezone(tz)
        if (wall.hour, wall.minute) != (hour, minute):  # only where that time did not exist
            wanted = datetime(wall.year, wall.month, wall.day, hour, minute, tzinfo=tz)
            assert wanted.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wanted.replace(
                tzinfo=None
            )
            assert (slot - MINUTE).astimezone(tz).utcoffset() != wall.utcoffset()


def _day_exists(day: date, tz: ZoneInfo) -> bool:
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=tz)
    return noon.astimezone(UTC).astimezone(tz).date() == day


@PROPERTY
@given(st.integers(0, 59), windows())
def test_a_wildcard_hour_schedule_runs_once_per_real_hour(
    minute: int, window: tuple[str, datetime]
) -> None:
    zone, start = window
    tz = ZoneInfo(zone)
    end = start + timedelta(days=3)
    shifts = {
        (t + MINUTE).astimezone(tz).utcoffset() - t.astimezone(tz).utcoffset()  # type: ignore[operator]
        for t in transitions(zone, start.year) + transitions(zone, end.year)
        for t in [t - MINUTE]
    }
    assume(all(s % HOUR == timedelta(0) for s in shifts))  # not 30-minute shifts
    schedule = cron.Schedule(f"{minute} * * * *", zone)
    hour = start.replace(minute=0, second=0, microsecond=0) + HOUR
    slots = rota_slots(schedule, hour, hour + timedelta(hours=70))
    per_hour = Counter(s.replace(minute=0) for s in slots)
    assert per_hour == Counter(hour + HOUR * i for i in range(70)), zone
    assert all(b - a == HOUR for a, b in itertools.pairwise(slots))


@PROPERTY
@given(expressions(), st.datetimes(datetime(2000, 1, 1), datetime(2037, 12, 31)))
def test_in_utc_slots_agree_with_croniter(expr: Expr, naive_start: datetime) -> None:
    # croniter applies the either-day rule to a '*/n' day field too; classic cron does not.
    assume(not any(f.startswith("*/") for f in expr.text.split()[2::2]))
    # Nor where croniter is wrong: a one-value range (9-9), and a/n in the weekday
    # field (croniter ends it at 6, not at 7, Sunday, and takes 7/n as *).
    parts = [p for f in expr.text.split() for p in f.split(",")]
    ranges = [re.fullmatch(r"(\w+)-(\w+)(/\d+)?", p) for p in parts]
    assume(not any(m and cron._rank(m[1]) == cron._rank(m[2]) for m in ranges))
    assume(not any(re.fullmatch(r"\w+/\d+", p) for p in expr.text.split()[4].split(",")))
    schedule = schedule_of(expr, "UTC")
    start = naive_start.replace(tzinfo=UTC)
    ours = schedule.slots(start, 10)
    theirs = croniter(expr.text, start)
    assert ours == [theirs.get_next(datetime) for _ in ours]


@pytest.mark.parametrize(
    ("expr", "field", "values"),
    [
        ("0 9-9 * * *", "hours", (9,)),  # was every hour: croniter expands 9-9 as *
        ("1-1,30 * * * *", "minutes", (1, 30)),  # was every minute
        ("3-3/5 * * * *", "minutes", (3,)),  # was */5
        ("0 0 * * mon-mon", "weekdays", frozenset({1})),
        ("0 0 * * 7-7", "weekdays", frozenset({0})),
        ("0 0 * jun-jun *", "months", frozenset({6})),
        ("0 0 15-15 * *", "days", frozenset({15})),
        ("0 0 * * 7/1", "weekdays", frozenset({0})),  # was every day
    ],
)
def test_a_range_of_one_value_is_that_value(expr: str, field: str, values: object) -> None:
    assert getattr(cron.parse(expr), field) == values
    after = datetime(2026, 3, 1, tzinfo=UTC)
    if field == "hours":
        assert [s.hour for s in cron.Schedule(expr).slots(after, 3)] == [9, 9, 9]
