"""The checks of every number and payload a user gives Rota, each in one place.

The CLI, the operator, the Python API and the settings dataclasses all call
these, so a lease, a delay or a payload is accepted or refused the same way
wherever it comes from. Each raises `InvalidInput` with a one-line reason and
returns the value as Rota stores it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from rota.errors import MAX_DELAY_SECONDS, InvalidInput

MAX_PAYLOAD_BYTES = 256 * 1024
"""Largest JSON payload accepted by default, in bytes. Jobs carry references,
not documents; large payloads bloat the table every claim walks."""

MIN_LEASE_SECONDS = 1.0
"""Shorter leases would need heartbeats faster than a busy database answers."""

PRIORITIES = range(10)
"""0 runs first, 9 last (the scale of Oban and of DESIGN.md)."""


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{what} must be a number, not {value!r}")
    return float(value)


def lease_seconds(value: Any, what: str = "lease") -> float:
    seconds = _number(value, what)
    if seconds < MIN_LEASE_SECONDS:
        raise InvalidInput(f"{what} must be at least {MIN_LEASE_SECONDS:g} second, not {value!r}")
    return seconds


def interval_seconds(value: Any, what: str = "interval") -> float:
    seconds = _number(value, what)
    if seconds <= 0:
        raise InvalidInput(f"{what} must be more than 0 seconds, not {value!r}")
    return seconds


def delay_seconds(value: Any, what: str = "delay") -> float:
    seconds = _number(value, what)
    if seconds < 0:
        raise InvalidInput(f"{what} must not be negative: {value!r}")
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidInput(
            f"{what} must be at most {MAX_DELAY_SECONDS:.0f} seconds (ten years), not {value!r}"
        )
    return seconds


def timeout_seconds(value: Any, what: str = "timeout") -> float:
    return interval_seconds(value, what)


def priority(value: Any, what: str = "priority") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in PRIORITIES:
        raise InvalidInput(f"{what} must be a whole number from 0 (first) to 9, not {value!r}")
    return value


def text(value: str, what: str) -> str:
    """A string PostgreSQL can store: refused when it holds a NUL character."""
    if "\x00" in value:
        raise InvalidInput(f"{what} must not contain a NUL character (PostgreSQL cannot store it)")
    return value


_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""A NUL in encoded JSON: \\u0000 after an even number of backslashes (after an
odd number, its backslash ends an escaped backslash: the text \\\\u0000)."""


def encode_payload(payload: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """The payload as compact JSON ({} for None), refused when too large or when
    it holds a NUL character (jsonb cannot store one)."""
    return _encode_json({} if payload is None else payload, max_bytes, "payload")


def encode_result(value: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """A handler's return value as compact JSON, under the payloads' limits: refused
    (an error of the attempt that returned it) when it is not JSON, too large, or
    holds a NUL character."""
    return _encode_json(value, max_bytes, "the handler's return value")


def _encode_json(value: Any, max_bytes: int, what: str) -> str:
    try:
        encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    if _ESCAPED_NUL.search(encoded):
        raise InvalidInput(f"{what} must not contain a NUL character (jsonb cannot store it)")
    size = len(encoded.encode())
    if size > max_bytes:
        raise InvalidInput(f"{what} is {size} bytes, over the limit of {max_bytes} bytes")
    return encoded
