"""The checks of every value a user gives Rota, each in one place.

The CLI, the operator, the console, the Python API and the settings
dataclasses all call these, so a lease, a time, a job type or a payload is
accepted or refused the same way wherever it comes from. Each raises
`InvalidInput` with a one-line reason before anything is written, and returns
the value as Rota stores it. The limits are the ones docs/limits.md lists:
what PostgreSQL's columns and indexes and Python's types can all hold.
"""

from __future__ import annotations

import functools
import json
import math
import re
import zoneinfo
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from rota.errors import MAX_DELAY_SECONDS, InvalidInput
from rota.jobs import NewJob

INTEGER_MAX = 2**31 - 1
"""Largest value of an int4 column (max_attempts, spread and deadline seconds, concurrency)."""
BIGINT_MAX = 2**63 - 1
"""Largest value of an int8 column: job ids."""

MAX_SECONDS = MAX_DELAY_SECONDS
"""Longest span of seconds accepted anywhere (a lease, a timeout, a delay, an
interval): ten years, which PostgreSQL's intervals and Python's datetimes hold."""

MIN_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
MAX_INSTANT = datetime(9999, 12, 30, tzinfo=UTC)
"""Times accepted (run_at, --from): PostgreSQL holds far more, but a time read
back into Python in any session time zone must stay within datetime's years
1 to 9999; a day's margin at the top covers every UTC offset."""

MAX_NAME_BYTES = 1024
"""Longest job type, idempotency key, effect name, schedule name or group, in
UTF-8 bytes. A btree index entry must fit in a third of a page (2,704 bytes);
the largest index over names holds two of them (the effect marker's key and
effect)."""

MAX_CRON_BYTES = 1024
"""Longest cron expression, in UTF-8 bytes as written (white space included):
five fields list every minute, hour, day and month in under 400; the database
refuses a longer one too (migration 0037)."""

MAX_JSON_DEPTH = 100
"""Deepest nesting of arrays and objects in a payload: Python's JSON reader
recurses once per level and would fail reading a much deeper one back."""

_RESERVED_ZONES = frozenset({"localtime", "posixrules", "Factory"})

MAX_PAYLOAD_BYTES = 256 * 1024
"""Largest JSON payload accepted by default, in bytes. Jobs carry references,
not documents; large payloads bloat the table every claim walks."""

MIN_LEASE_SECONDS = 1.0
"""Shorter leases would need heartbeats faster than a busy database answers."""

PRIORITIES = range(10)
"""0 runs first, 9 last (the scale of Oban and of DESIGN.md)."""


_WHOLE_TEXT = re.compile(r"-?[0-9]+")
_NUMBER_TEXT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def whole_text(text: str) -> int:
    """A whole number written in ASCII digits, a minus sign allowed; ValueError for
    what else `int` takes (another script's digits, `_` between digits, a plus
    sign, spaces). Every door that reads a number typed as text reads it so."""
    if not _WHOLE_TEXT.fullmatch(text):
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def number_text(text: str) -> float:
    """A number written in ASCII digits with an optional minus sign, point and
    exponent (`1.5`, `2e3`); ValueError for what else `float` takes (`nan`,
    `inf`, `1_0`, another script's digits, spaces)."""
    if not _NUMBER_TEXT.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number, not {_short(value)}")
    if isinstance(value, int):
        # float() overflows past 2**1024: such a number is past every bound on its side.
        if not -_FLOAT_INT < value < _FLOAT_INT:
            return _PAST if value > 0 else -_PAST
        return float(value)
    if not math.isfinite(value):
        raise InvalidInput(f"{what} must be a number, not {_short(value)}")
    return float(value)


_FLOAT_INT = 2**1023
"""Whole numbers below this in size convert to a float without overflow."""
_PAST = 2.0**1023
"""Stands for a whole number too large for a float: larger than any bound."""


def _seconds(value: Any, what: str) -> float:
    seconds = _number(value, what)
    if seconds > MAX_SECONDS:
        raise InvalidInput(
            f"{what} must be at most {MAX_SECONDS:.0f} seconds (ten years), not {_short(value)}"
        )
    return seconds


def lease_seconds(value: Any, what: str = "lease") -> float:
    seconds = _seconds(value, what)
    if seconds < MIN_LEASE_SECONDS:
        raise InvalidInput(
            f"{what} must be at least {MIN_LEASE_SECONDS:g} second, not {_short(value)}"
        )
    return seconds


def interval_seconds(value: Any, what: str = "interval") -> float:
    seconds = _seconds(value, what)
    if seconds <= 0:
        raise InvalidInput(f"{what} must be more than 0 seconds, not {_short(value)}")
    return seconds


def delay_seconds(value: Any, what: str = "delay") -> float:
    seconds = _seconds(value, what)
    if seconds < 0:
        raise InvalidInput(f"{what} must not be negative: {_short(value)}")
    return seconds


def timeout_seconds(value: Any, what: str = "timeout") -> float:
    return interval_seconds(value, what)


MAX_MILLISECONDS_TIMEOUT = INTEGER_MAX // 1000
"""Longest statement_timeout, lock_timeout or TCP_USER_TIMEOUT, in whole seconds
(about 24.8 days): each travels as a 32-bit count of milliseconds."""

MAX_KEEPALIVE_SECONDS = 32767
"""Longest TCP keepalive idle time or probe interval Linux takes (TCP_KEEPIDLE,
TCP_KEEPINTVL), in seconds; a larger one makes every connection attempt fail."""

MAX_KEEPALIVE_PROBES = 127
"""Most unanswered TCP keepalive probes Linux takes (TCP_KEEPCNT)."""


def seconds_within(value: Any, what: str, least: float, most: float = MAX_SECONDS) -> float:
    """A span of seconds from `least` to `most`."""
    seconds = _seconds(value, what)
    if not least <= seconds <= most:
        raise InvalidInput(
            f"{what} must be from {least:g} to {most:.0f} seconds, not {_short(value)}"
        )
    return seconds


def priority(value: Any, what: str = "priority") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in PRIORITIES:
        raise InvalidInput(
            f"{what} must be a whole number from 0 (first) to 9, not {_short(value)}"
        )
    return value


def whole(value: Any, what: str, minimum: int = 1, maximum: int = INTEGER_MAX) -> int:
    """A whole number in [minimum, maximum] (by default an int4 column's positive range)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(
            f"{what} must be a whole number of at least {minimum}, not {_short(value)}"
        )
    if value > maximum:
        raise InvalidInput(f"{what} must be at most {maximum}, not {_short(value)}")
    return value


def job_id(value: Any, what: str = "job id") -> int:
    return whole(value, what, 1, BIGINT_MAX)


def job_ids(values: Any, what: str = "job ids") -> list[int]:
    return [job_id(v, f"{what[:-1]}") for v in _sequence(values, what)]


def text(value: Any, what: str) -> str:
    """A string PostgreSQL can store: valid UTF-8 (no lone surrogates, which a
    command line makes of undecodable bytes) and no NUL character."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, not {_short(value)}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} is not valid UTF-8: {_short(value)}") from None
    if "\x00" in value:
        raise InvalidInput(f"{what} must not contain a NUL character (PostgreSQL cannot store it)")
    return value


def name(value: Any, what: str) -> str:
    """A job type, key, effect, group or schedule name: non-blank text of at most
    MAX_NAME_BYTES bytes, so that every index over it can hold it."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-empty string, not {_short(value)}")
    text(value, what)
    size = len(value.encode())
    if size > MAX_NAME_BYTES:
        raise InvalidInput(f"{what} is {size} bytes long, over the limit of {MAX_NAME_BYTES}")
    return str(value)


SCHEDULE_KEY_PREFIX = "schedule:"
"""The keys of a schedule's jobs start with it (rota.schedule_store): a job
enqueued ahead under one would take a slot, or the window of a unique schedule,
from the scheduler. The database refuses it on every other job (migration 0045)."""


def idempotency_key(value: Any) -> str:
    """A job's key: a name that is not under the prefix of a schedule's jobs."""
    key = name(value, "an idempotency key")
    if key.startswith(SCHEDULE_KEY_PREFIX):
        raise InvalidInput(
            f"an idempotency key must not start with {SCHEDULE_KEY_PREFIX!r}"
            " (the prefix is reserved for the jobs of schedules)"
        )
    return key


def names(values: Any, what: str) -> list[str]:
    """A sequence of names, never a bare string (which would be its characters)."""
    return [name(v, what[:-1] if what.endswith("s") else what) for v in _sequence(values, what)]


def listed(values: Any, what: str) -> list[Any]:
    """A list or tuple of values, never a bare string (which would be its characters)."""
    return _sequence(values, what)


def _sequence(values: Any, what: str) -> list[Any]:
    if isinstance(values, str | bytes | bytearray | dict) or not isinstance(values, Iterable):
        raise InvalidInput(f"{what} must be a list, not {_short(values)}")
    return list(values)


def instant(value: Any, what: str) -> datetime:
    """An aware datetime from MIN_INSTANT to MAX_INSTANT."""
    if not isinstance(value, datetime):
        raise InvalidInput(f"{what} must be a datetime, not {_short(value)}")
    try:
        offset = value.utcoffset()
        utc = value.astimezone(UTC) if offset is not None else None
    except (ValueError, OverflowError, TypeError):
        raise InvalidInput(
            f"{what} {value.isoformat()} lies outside the years 1970 to 9999"
        ) from None
    if utc is None:
        raise InvalidInput(f"{what} must carry a time zone (naive datetimes are ambiguous)")
    if not MIN_INSTANT <= utc <= MAX_INSTANT:
        raise InvalidInput(
            f"{what} must be from {MIN_INSTANT:%Y-%m-%d} to {MAX_INSTANT:%Y-%m-%d} UTC,"
            f" not {value.isoformat()}"
        )
    return value


def clock(value: Any) -> datetime | None:
    """An instant a caller gives in place of the database's clock (`now=`): None
    (the database's `now()`) or an aware datetime, never text for PostgreSQL to
    read nor a naive time it would read in the session's time zone."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidInput(
            f"now must be an aware datetime (None: the database's clock), not {_short(value)}"
        )
    return instant(value, "now")


def parse_instant(value: str, what: str) -> datetime:
    """An ISO-8601 instant (UTC when it has no offset) within the accepted range."""
    text(value, what)
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{what} is not an ISO-8601 time like 2030-03-14T15:30: {_short(value)}"
        ) from None
    return instant(parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC), what)


def zone_name(value: Any) -> str:
    """An IANA time zone name (Europe/Berlin, UTC); never a path or a local alias."""
    if not isinstance(value, str) or value not in _iana_zones():
        raise InvalidInput(
            f"unknown time zone {_short(value)}: use an IANA name like Europe/Berlin"
        )
    return value


@functools.cache
def _iana_zones() -> frozenset[str]:
    return frozenset(
        z
        for z in zoneinfo.available_timezones()
        if z not in _RESERVED_ZONES and not z.startswith(("posix/", "right/"))
    )


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."


_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""A NUL in encoded JSON: \\u0000 after an even number of backslashes (after an
odd number, its backslash ends an escaped backslash: the text \\\\u0000)."""


def new_job(job: NewJob, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """Check every field of a job to enqueue (a parent's child included) before
    anything is written; its payload as compact JSON."""
    if not isinstance(job, NewJob):
        raise InvalidInput(f"enqueue_many takes NewJob values, not {type(job).__name__}")
    name(job.type, "job type")
    if job.run_at is not None and job.delay is not None:
        raise InvalidInput("give run_at or delay, not both")
    if job.run_at is not None:
        instant(job.run_at, "run_at")
    if job.delay is not None:
        delay_seconds(job.delay)
    if job.max_attempts is not None:
        whole(job.max_attempts, "max_attempts")
    if job.priority is not None:
        priority(job.priority)
    if job.timeout is not None:
        timeout_seconds(job.timeout)
    if job.key is not None:
        idempotency_key(job.key)
    if job.group is not None:
        name(job.group, "a group")
    if job.unique_for is not None or job.unique_active is not False:
        unique(job.key, job.unique_for, job.unique_active)
    return encode_payload(job.payload, max_payload_bytes)


def encode_payload(payload: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """The payload as compact JSON ({} for None), refused when too large, nested
    deeper than MAX_JSON_DEPTH, when it holds a NUL character or a lone surrogate
    (jsonb stores neither), or a key that is not text (JSON would make 1 into "1",
    and keep one of {1: "a", "1": "b"})."""
    return _encode_json({} if payload is None else payload, max_bytes, "payload", text_keys=True)


def encode_result(value: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """A handler's return value as compact JSON, under the payloads' limits: refused
    (an error of the attempt that returned it) when it is not JSON, too large, too
    deeply nested, or holds a NUL character or a lone surrogate. Its keys are made
    text, as JSON makes them: refused after the handler's work, the job would run
    again."""
    return _encode_json(value, max_bytes, "the handler's return value")


def encode_value(value: Any, what: str, max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """Any other JSON value Rota stores (an effect's result), under the payloads'
    limits; `what` names it in the reason of a refusal."""
    return _encode_json(value, max_bytes, what)


_SCALARS = {None: "null", True: "true", False: "false"}
"""The JSON of the values a step or handler returns most, with nothing to check."""

_SMALL_INT = 2**53
"""Integers below this in size are their own JSON, a few bytes long."""


def _encode_json(value: Any, max_bytes: int, what: str, text_keys: bool = False) -> str:
    if value is None or type(value) is bool:
        encoded = _SCALARS[value]
        if len(encoded) <= max_bytes:
            return encoded
    elif type(value) is int and -_SMALL_INT < value < _SMALL_INT:
        encoded = str(value)
        if len(encoded) <= max_bytes:
            return encoded
    encoded, size = _measured(value, max_bytes, what, text_keys)
    if size > max_bytes:
        raise InvalidInput(f"{what} is {size} bytes, over the limit of {max_bytes} bytes")
    return encoded


def stored_bytes(value: Any) -> int:
    """The size of a JSON value as the database counts it, `octet_length` of
    the text PostgreSQL prints of its jsonb (`payload::text`): the compact JSON
    Rota sends, a space after each `,` and `:`, and each number written out in
    full (`1e300` is 301 digits)."""
    return _measured(value, 2**62, "value")[1]


def _measured(value: Any, max_bytes: int, what: str, text_keys: bool = False) -> tuple[str, int]:
    """The value's compact JSON, checked, and its size as the database prints it."""
    printed = _check_tree(value, max_bytes, what, text_keys)
    try:
        # Characters as they are, not escaped: measured in UTF-8, as the database
        # measures the text it prints.
        encoded = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    if _ESCAPED_NUL.search(encoded):
        raise InvalidInput(f"{what} must not contain a NUL character (jsonb cannot store it)")
    return encoded, len(encoded.encode()) + printed


def _printed_longer(number: float) -> int:
    """How much longer PostgreSQL prints a float than JSON writes it: in full,
    never with an exponent (`1e+300` is 301 digits, `1.5e-07` is 0.00000015),
    and a negative zero without its sign."""
    short = float.__repr__(number)
    if "e" not in short:
        return -1 if number == 0 and short.startswith("-") else 0
    return len(format(Decimal(short), "f")) - len(short)


def _check_tree(payload: Any, max_bytes: int, what: str, text_keys: bool = False) -> int:
    """Walk the payload without recursion: its depth, every string in it and, with
    `text_keys`, that every key is text. Returns how many bytes longer the
    database prints it than its compact JSON (see `stored_bytes`).

    Every value costs at least a byte of JSON, so a walk past `max_bytes` values
    (a structure that holds itself, say) is a payload over the limit.
    """
    pending: list[tuple[Any, int]] = [(payload, 1)]
    walked = 0
    printed = 0
    inside = what if what.startswith("the ") else f"the {what}"
    while pending:
        value, depth = pending.pop()
        walked += 1
        if walked > max_bytes:
            raise InvalidInput(f"{what} is over the limit of {max_bytes} bytes")
        if isinstance(value, str):
            text(value, f"a string in {inside}")
            continue
        if isinstance(value, float):
            if math.isfinite(value):  # else refused as not JSON when encoded
                printed += _printed_longer(value)
            continue
        if not isinstance(value, dict | list | tuple):
            continue
        if depth > MAX_JSON_DEPTH:
            raise InvalidInput(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
        if walked + len(pending) + len(value) > max_bytes:
            # Each value queued is walked later: refused before a list of
            # millions is queued (memory a worker may not have).
            raise InvalidInput(f"{what} is over the limit of {max_bytes} bytes")
        if value:  # ", " between items and ": " after each key
            printed += len(value) - 1 + (len(value) if isinstance(value, dict) else 0)
        if not isinstance(value, dict):
            pending.extend((item, depth + 1) for item in value)
            continue
        for key, item in value.items():
            if isinstance(key, str):
                text(key, f"a key in {inside}")
            elif text_keys:
                raise InvalidInput(
                    f"a key in {inside} must be text, not {type(key).__name__}"
                    " (JSON keys are text: it would come back changed)"
                )
            pending.append((item, depth + 1))
    return printed


MAX_UNIQUE_SECONDS = MAX_DELAY_SECONDS
"""The longest window `unique_for` accepts (ten years, as a delay)."""

MAX_RATE = 10_000
"""The most starts a rate limit counts per window: the claim keeps the time of
each start of the window in the limit's row."""


def unique(key: str | None, unique_for: Any, unique_active: Any) -> None:
    """The uniqueness of a job beyond its key: a window, or while it is active."""
    if not isinstance(unique_active, bool):
        raise InvalidInput(f"unique_active must be True or False, not {unique_active!r}")
    if key is None:
        raise InvalidInput("unique_for and unique_active need a key")
    if unique_for is not None and unique_active:
        raise InvalidInput("give unique_for or unique_active, not both")
    if unique_for is not None:
        seconds = interval_seconds(unique_for, "unique_for")
        if seconds > MAX_UNIQUE_SECONDS:
            raise InvalidInput(
                f"unique_for must be at most {MAX_UNIQUE_SECONDS:.0f} seconds, not {unique_for!r}"
            )


def limit_count(value: Any, what: str, most: int = 2**31 - 1) -> int | None:
    """A limit's whole number of jobs (None: no such limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidInput(f"{what} must be a whole number from 1 to {most}, not {_short(value)}")
    return value
