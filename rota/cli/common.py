"""What every `rota` subcommand shares: the database URL, input parsing, exits.

Exit codes: 0 ok, 2 bad usage or input (one-line reason, nothing written),
1 runtime error. Only the CLI and the ``__main__`` modules read the environment.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import string
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from rota import limits
from rota.errors import InvalidInput
from rota.reading import shown

T = TypeVar("T")


class UsageError(Exception):
    """Bad usage or input: printed as one line, exit code 2."""


def database_url() -> str:
    """ROTA_DATABASE_URL, or "" so libpq falls back to its PG* variables.

    A value libpq cannot read is bad input, said before anything connects."""
    url = os.environ.get("ROTA_DATABASE_URL", "")
    if url:
        _check_utf8(url)
        try:
            parts = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise UsageError(
                f"ROTA_DATABASE_URL is not a valid PostgreSQL URL: {exc}"
                " (expected postgresql://USER@HOST:PORT/DATABASE)"
            ) from None
        _check_ports(str(parts.get("port") or ""))
    return url


def is_utf8(text: str) -> bool:
    """Whether `text` is valid UTF-8: a byte of the command line or the environment
    that is not reaches Python as a lone surrogate."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_utf8(url: str) -> None:
    """libpq cannot be given a URL that is not UTF-8 (it is not repeated: it may
    hold a password)."""
    if not is_utf8(url):
        raise UsageError(
            "ROTA_DATABASE_URL is not valid UTF-8 (expected postgresql://USER@HOST:PORT/DATABASE)"
        )


def _check_ports(ports: str) -> None:
    """libpq reads a port it cannot use as a service name and fails to connect:
    said here as bad input instead (a list, one per host, may leave one empty)."""
    for port in ports.split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise UsageError(
                f"ROTA_DATABASE_URL has port {port!r}: a port is a whole number from 1 to 65535"
                " (expected postgresql://USER@HOST:PORT/DATABASE)"
            )


def parse_json(text: str | None, what: str = "--payload") -> Any:
    if text is None:
        return {}
    limits.text(text, what)
    try:
        return json.loads(text, parse_float=functools.partial(_double, what))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except ValueError:  # an integer longer than Python converts from text
        raise UsageError(
            f"{what} has a number of more than {sys.get_int_max_str_digits()} digits"
        ) from None
    except RecursionError:
        raise UsageError(
            f"{what} is nested more than {limits.MAX_JSON_DEPTH} levels deep"
        ) from None


def _double(what: str, text: str) -> float:
    """A JSON number with a point or an exponent, as Python reads it: a double,
    refused unless it is the number written (so that none is stored rounded)."""
    value = float(text)
    if math.isinf(value):
        raise UsageError(f"{what} has a number too large for a double: {text}")
    if Decimal(repr(value)) != Decimal(text):
        raise UsageError(
            f"{what} has a number a double cannot hold exactly: {text} (it would be {value!r};"
            " send a string, or enqueue in SQL, whose jsonb keeps any number)"
        )
    return value


def parse_instant(text: str, what: str) -> datetime:
    """An ISO-8601 instant within the accepted years; without an offset it is taken as UTC."""
    return limits.parse_instant(text, what)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""Units of a duration, in lower case only: m is minutes, and there is no month."""


def parse_duration(text: str, what: str) -> float:
    """Seconds from "90", "90s", "15m", "12h", "7d" or "2w"; the unit's case counts
    ("1M" is refused, never taken for a minute or a month)."""
    raw = text.strip()
    if raw.lstrip("+-").lower() in ("nan", "inf", "infinity"):
        raise UsageError(f"{what} must be a number, like 90s, 15m, 12h or 7d: {text!r}")
    number = raw.rstrip(string.ascii_letters)
    unit = raw[len(number) :]
    try:
        value = limits.number_text(number.rstrip())
    except ValueError:
        raise UsageError(f"{what} is not a duration like 90s, 15m, 12h or 7d: {text!r}") from None
    if unit and unit not in _UNITS:
        raise UsageError(
            f"{what} has an unknown unit {unit!r}: {text!r} (the units are s, m (minutes),"
            " h, d and w, in lower case)"
        )
    seconds = value * _UNITS.get(unit, 1)
    if not math.isfinite(seconds):
        raise UsageError(f"{what} must be a number, like 90s, 15m, 12h or 7d: {text!r}")
    if seconds < 0:
        raise UsageError(f"{what} must not be negative: {text!r}")
    try:
        return limits.delay_seconds(seconds, what)
    except InvalidInput as exc:  # as UsageError, so argparse never words it (--watch)
        raise UsageError(str(exc)) from None


def decimal(text: str) -> float:
    """argparse type (its name is in argparse's message): `limits.number_text`."""
    return limits.number_text(text)


def whole_number(text: str) -> int:
    """argparse type: `limits.whole_text`, any sign."""
    try:
        return limits.whole_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str, maximum: int = limits.INTEGER_MAX) -> int:
    """argparse type: an integer from 1 to `maximum` (by default what an int4 column
    holds); argparse names the option in the error."""
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    if value > maximum:
        raise argparse.ArgumentTypeError(f"must be at most {maximum}: {text!r}")
    return value


def checked(convert: Callable[[str], T], check: Callable[[T, str], object]) -> Callable[[str], T]:
    """argparse type: `convert` the text, then `check` it (a `rota.limits` function).

    argparse puts the option's name before the reason: `argument --priority: must
    be a whole number from 0 (first) to 9, not 10`."""

    def parse(text: str) -> T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        try:
            check(value, "")
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(str(exc).strip()) from None
        return value

    parse.__name__ = getattr(check, "__name__", "value")
    return parse


def unique_flags(parser: Any, for_help: str, active_help: str) -> None:
    """--unique-for SECONDS and --unique-active, one or the other."""
    unique = parser.add_mutually_exclusive_group()
    unique.add_argument("--unique-for", type=decimal, metavar="SECONDS", help=for_help)
    unique.add_argument("--unique-active", action="store_true", help=active_help)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = whole_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 0 to 65535: {text!r}")
    return value


def address(text: str) -> str:
    """argparse type: a host name or address to listen on, never blank (a server
    given an empty one listens on every interface)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"must be a host name or address such as 127.0.0.1 (0.0.0.0: every interface),"
            f" not {text!r}"
        )
    return text


def table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells (the first row the header) as aligned columns, cells `shown`."""
    cells = [[shown(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in cells
    )


_NOT_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _finite(value: Any) -> Any:
    """`value` with NaN and the infinities as the strings "NaN", "Infinity" and
    "-Infinity", which strict JSON has no numbers for."""
    if isinstance(value, float) and not math.isfinite(value):
        return _NOT_FINITE.get(value, "NaN")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _json_default(value: Any) -> str:
    """A time in ISO-8601 (one past Python's range as PostgreSQL's text), else its str."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def json_text(value: Any, indent: int | None = None) -> str:
    """`value` as strict JSON, keys sorted: times in ISO-8601, NaN and the
    infinities as strings (a value rarely holds them: only then is it copied)."""
    try:
        return json.dumps(
            value, indent=indent, sort_keys=True, default=_json_default, allow_nan=False
        )
    except ValueError:  # "Out of range float values are not JSON compliant"
        return json.dumps(
            _finite(value), indent=indent, sort_keys=True, default=_json_default, allow_nan=False
        )


def print_json(value: Any) -> None:
    print(json_text(value, indent=2))
