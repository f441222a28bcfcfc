"""Cron expressions in a time zone: which instants are a schedule's slots.

Pure computation (no database, no clock): the scheduler, the CLI preview and
the operator's validation all ask this module, so they cannot disagree.

Daylight saving time follows classic cron. A schedule is *wildcard-hour* when
its hour field covers all 24 hours (``*``, ``*/1``, ``0-23``) and *fixed-hour*
otherwise. On the spring-forward day a fixed-hour slot whose wall time does not
exist runs once, at the first instant after the gap (several such slots in one
gap still make one run); a wildcard-hour schedule simply has no slot in the
gap. On the fall-back day a fixed-hour slot runs once, at the first occurrence
of its wall time, while a wildcard-hour schedule runs in both occurrences of
the repeated hour (once per real hour). A slot is always a whole minute.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from rota import limits
from rota.errors import InvalidInput

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_RANGE = re.compile(r"(\w+)-(\w+)")
_NAMES = {
    name: i
    for i, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1
    )
}
_NAMES |= {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}


def _rank(token: str) -> int:
    """A range end as a number (croniter wraps a backwards range; classic cron refuses it)."""
    return int(token) if token.isdigit() else _NAMES.get(token.lower(), -1)


_SINGLE_RANGE = re.compile(r"(\w+)-(\w+)(?:/0*[1-9]\d*)?")


def _collapsed(field: str) -> str:
    """The field with each one-value range (``9-9``, ``mon-mon/2``) written as that value.

    croniter expands a list holding such a range as ``*`` (every value) and
    ``a-a/n`` as ``*/n``; classic cron means the one value.
    """
    parts = []
    for part in field.split(","):
        match = _SINGLE_RANGE.fullmatch(part)
        single = match and _rank(match[1]) == _rank(match[2]) >= 0
        parts.append(match[1] if match and single else part)
    return ",".join(parts)


_FROM_ONE_DAY = re.compile(r"(\w+)/0*([1-9]\d*)")


def _collapsed_weekdays(field: str) -> str:
    """Also each ``a/n`` written as its days: from `a` to the field's end, 7
    (Sunday) included, as ``a-7/n``. croniter ends it at 6 (``1/2`` lost
    Sunday) and expands ``7/n`` as ``*``."""
    parts = []
    for part in field.split(","):
        match = _FROM_ONE_DAY.fullmatch(part)
        first = _rank(match[1]) if match else -1
        if match and 0 <= first <= 7:
            part = ",".join(str(day) for day in range(first, 8, int(match[2])))
        parts.append(part)
    return ",".join(parts)


# name, lowest, highest value
_FIELDS = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 6),
]
# A valid expression fires at least once in this many days (Feb 29 across a
# non-leap century year needs 8 years).
_SEARCH_DAYS = 9 * 366


@dataclasses.dataclass(frozen=True)
class Cron:
    """A parsed 5-field expression: the allowed values of each field."""

    expr: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_restricted: bool
    weekday_restricted: bool

    @property
    def wildcard_hour(self) -> bool:
        return len(self.hours) == 24

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = (day.weekday() + 1) % 7 in self.weekdays
        if self.day_restricted and self.weekday_restricted:
            return in_days or in_weekdays  # classic cron: either field may match
        return in_days and in_weekdays


_PARTS = re.compile(r"[,/-]")
_EXTENSION = re.compile(r"(?i)r(?:\(.*)?|\d*w")
"""croniter's extensions no classic cron has and `croniter.expand` lets through
as plain values: ``R`` and ``R(a-b)``, a value drawn at random at each parse
(the slots would move between two ticks), and ``15W``, the weekday nearest
the 15th (expanded as the 15th itself)."""

_ANY_VALUE = ("*", "?")
"""How a day field that restricts nothing starts: ``?`` is croniter's (and
Quartz's) ``*`` for the day of the month or of the week, so ``0 0 ? * 1`` is
every Monday, not every day."""


def parse(expr: str) -> Cron:
    """Parse a 5-field expression or a macro of at most `limits.MAX_CRON_BYTES`;
    raise `InvalidInput` saying what is wrong.

    croniter expands the fields (names, ranges, steps, bounds); the extensions
    it also accepts (seconds, ``L``, ``#``, ``H``, ``R``, ``W``) are refused,
    since the DST rules below are defined for classic 5-field cron only; ``?``
    is taken as ``*`` in the day fields.
    """
    size = len(str(expr).encode(errors="surrogatepass"))
    if size > limits.MAX_CRON_BYTES:
        raise InvalidInput(
            f"cron expression is {size} bytes long, over the limit of {limits.MAX_CRON_BYTES}"
        )
    text = " ".join(str(expr).split())
    if text.startswith("@") and text.lower() not in MACROS:
        raise InvalidInput(f"invalid cron expression {text!r}: unknown macro")
    fields = MACROS.get(text.lower(), text).split(" ")
    if len(fields) != 5:
        raise InvalidInput(
            f"invalid cron expression {text!r}: expected 5 fields, got {len(fields)}"
        )
    for (name, _, _), field in zip(_FIELDS, fields, strict=True):
        if any(_EXTENSION.fullmatch(part) for part in _PARTS.split(field)):
            raise InvalidInput(
                f"invalid cron expression {text!r}: {name} field is not classic cron"
            )
    backwards = next(
        (r for f in fields for r in _RANGE.findall(f) if _rank(r[0]) > _rank(r[1])), None
    )
    if backwards:
        raise InvalidInput(
            f"invalid cron expression {text!r}: range {'-'.join(backwards)!r} runs backwards"
        )
    try:
        collapsed = [_collapsed(f) for f in fields]
        collapsed[4] = _collapsed_weekdays(collapsed[4])
        expanded, nth_weekday = croniter.expand(" ".join(collapsed))
    except (CroniterError, ValueError) as exc:
        raise InvalidInput(
            f"invalid cron expression {text!r}: {_which_field(fields, exc)}"
        ) from None
    if nth_weekday:  # 5#2: the second Friday of the month
        raise InvalidInput(
            f"invalid cron expression {text!r}: day of week field is not classic cron"
        )
    values: list[set[int]] = []
    for (name, low, high), entries in zip(_FIELDS, expanded, strict=True):
        if entries == ["*"]:
            values.append(set(range(low, high + 1)))
        elif not all(isinstance(v, int) for v in entries):
            raise InvalidInput(
                f"invalid cron expression {text!r}: {name} field is not classic cron"
            )
        else:
            values.append(set(entries))
    weekdays = {0 if d == 7 else d for d in values[4]}
    return Cron(
        expr=text,
        minutes=tuple(sorted(values[0])),
        hours=tuple(sorted(values[1])),
        days=frozenset(values[2]),
        months=frozenset(values[3]),
        weekdays=frozenset(weekdays),
        day_restricted=not fields[2].startswith(_ANY_VALUE),
        weekday_restricted=not fields[4].startswith(_ANY_VALUE),
    )


def _which_field(fields: list[str], exc: Exception) -> str:
    """Name the field croniter refused, by expanding each one alone."""
    for i, (name, _, _) in enumerate(_FIELDS):
        alone = ["*"] * 5
        alone[i] = fields[i]
        try:
            croniter.expand(" ".join(alone))
        except (CroniterError, ValueError) as field_exc:
            reason = str(field_exc).rsplit("]", 1)[-1].strip(" ,")
            reason = reason.removeprefix("is not acceptable").strip(" ,")
            return f"{name} field {fields[i]!r}: {reason or 'not a valid value'}"
    return str(exc)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone of that name; raise `InvalidInput` for an unknown one."""
    try:
        return ZoneInfo(limits.zone_name(name))
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(
            f"unknown time zone {name!r}: use an IANA name like Europe/Berlin"
        ) from None


class Schedule:
    """A cron expression in a time zone: its slots as UTC instants."""

    def __init__(self, expr: str, timezone: str = "UTC") -> None:
        self.cron = parse(expr)
        self.zone = zone(timezone)
        if self.next_slot(datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise InvalidInput(f"invalid cron expression {self.cron.expr!r}: it never fires")

    def next_slot(self, after: datetime) -> datetime | None:
        """The first slot strictly after `after` (None if none within 9 years)."""
        for slots in self._days_from(after, _SEARCH_DAYS):
            i = bisect.bisect_right(slots, after)
            if i < len(slots):
                return slots[i]
        return None

    def slots(self, after: datetime, count: int) -> list[datetime]:
        """The next `count` slots after `after`."""
        found: list[datetime] = []
        current: datetime | None = after
        while len(found) < count and current is not None:
            current = self.next_slot(current)
            if current is not None:
                found.append(current)
        return found

    def due(self, first: datetime, until: datetime) -> tuple[int, datetime | None]:
        """How many slots lie in [first, until], and the latest of them."""
        count, latest = 0, None
        days = (until - first).days + 3
        for slots in self._days_from(first - timedelta(microseconds=1), days):
            lo, hi = bisect.bisect_left(slots, first), bisect.bisect_right(slots, until)
            # A day's slot moved out of a gap to the next valid instant may be the
            # next day's own (a skipped day's midnight is the next midnight): one slot.
            if latest is not None:
                lo = max(lo, bisect.bisect_right(slots, latest))
            if hi > lo:
                count, latest = count + hi - lo, slots[hi - 1]
        return count, latest

    def _days_from(self, instant: datetime, days: int) -> Iterator[tuple[datetime, ...]]:
        """Slot lists of the local days from the day before `instant` on, in order."""
        start = instant.astimezone(self.zone).date() - timedelta(days=1)
        for offset in range(days + 1):
            day = start + timedelta(days=offset)
            if self.cron.matches_day(day):
                yield _day_slots(self.cron, self.zone, day)


def same_slots(first: str, second: str) -> bool:
    """Whether two expressions name the same slots however written (spacing,
    `@hourly` for `0 * * * *`); False when either does not parse."""
    try:
        one, other = parse(first), parse(second)
    except InvalidInput:
        return False
    return dataclasses.replace(one, expr="") == dataclasses.replace(other, expr="")


@functools.lru_cache(maxsize=4096)
def _day_slots(cron: Cron, tz: ZoneInfo, day: date) -> tuple[datetime, ...]:
    """Every slot of one local calendar day, as sorted UTC instants."""
    found: set[datetime] = set()
    for hour in cron.hours:
        for minute in cron.minutes:
            wall = datetime(day.year, day.month, day.day, hour, minute)
            found.update(_instants(wall, tz, cron.wildcard_hour))
    return tuple(sorted(found))


def _instants(wall: datetime, tz: ZoneInfo, wildcard_hour: bool) -> list[datetime]:
    """The instants a local wall time stands for, under the DST rules above."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if first == second:
        return [first]
    exists = first.astimezone(tz).replace(tzinfo=None) == wall
    if exists:  # fall-back: the wall time happens twice
        return sorted({first, second}) if wildcard_hour else [min(first, second)]
    if wildcard_hour:  # spring-forward gap: no such minute today
        return []
    return [_transition(min(first, second), max(first, second), tz)]


def _transition(before: datetime, after: datetime, tz: ZoneInfo) -> datetime:
    """The instant the UTC offset changes, between two instants on either side of it."""
    target = after.astimezone(tz).utcoffset()
    low, high = 0, int((after - before).total_seconds())
    while high - low > 1:  # invariant: offset at before+low differs, at before+high is target
        middle = (low + high) // 2
        if (before + timedelta(seconds=middle)).astimezone(tz).utcoffset() == target:
            high = middle
        else:
            low = middle
    return before + timedelta(seconds=high)


def preview(
    expr: str, timezone: str = "UTC", start: datetime | None = None, count: int = 10
) -> list[datetime]:
    """The next `count` slots after `start` (default: now), in the schedule's time zone."""
    schedule = Schedule(expr, timezone)
    after = datetime.now(UTC) if start is None else limits.instant(start, "start")
    try:
        return [slot.astimezone(schedule.zone) for slot in schedule.slots(after, count)]
    except OverflowError:
        raise InvalidInput(
            f"{count} slots after {after.isoformat()} run past the year 9999"
        ) from None
