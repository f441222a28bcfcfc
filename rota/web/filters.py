"""The job filter of the console: query parameters in, checked values out.

Everything a person types into the filter form arrives here as text and leaves
as typed values for bound SQL parameters, or as `InvalidInput` with a one-line
reason (the console answers 400 and writes nothing). Pure: no database.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from rota import limits
from rota.errors import InvalidInput
from rota.jobs import Status
from rota.lookup import status_named

MAX_ID = 2**63 - 1
PAGE_SIZES = range(1, 201)
DEFAULT_PAGE_SIZE = 50
SCAN_ROWS = 10_000
"""Rows a filter on type, payload or time examines per page at most."""
MAX_TEXT = 500
"""Longest filter value accepted (a payload expression, an error's text); a type
or a key is any name a job can hold (`limits.name`)."""

FIELDS = ("status", "type", "key", "payload", "error", "created_from", "created_to")
RETRYING = "retrying"
"""The status filter's name for ready jobs waiting for another attempt after a
failed one (attempts > 0): not a status of its own in the database."""


@dataclasses.dataclass(frozen=True)
class JobFilter:
    status: Status | None = None
    type: str | None = None
    key: str | None = None
    payload: dict[str, Any] | None = None
    payload_text: str = ""
    created_from: datetime | None = None
    created_to: datetime | None = None
    retrying: bool = False
    """Only ready jobs that failed before and wait for their next attempt."""
    error: str | None = None
    """Text the job's last error contains (any case)."""

    @property
    def bounded(self) -> bool:
        """True when the type, payload and time filters apply to a bounded window of
        rows: when they would otherwise walk the done rows, the bulk of the table. The
        rows of any other status are few, read from their partial index, and filtered
        in full."""
        small = self.status is not None and self.status != Status.DONE
        return not small and any(
            v is not None
            for v in (self.type, self.payload, self.error, self.created_from, self.created_to)
        )

    def params(self) -> dict[str, Any]:
        """The bound parameters of the SQL filters (payload still as a dict)."""
        return {
            "status": self.status.value if self.status else None,
            "type": self.type,
            "key": self.key,
            "payload": json.dumps(self.payload) if self.payload is not None else None,
            "created_from": self.created_from,
            "created_to": self.created_to,
            "retrying": self.retrying,
            "error": self.error,
        }

    def form(self) -> dict[str, str]:
        """The filter as the form shows it (and as links carry it)."""
        values = {
            "status": self.status_text,
            "type": self.type or "",
            "key": self.key or "",
            "payload": self.payload_text,
            "error": self.error or "",
            "created_from": _show(self.created_from),
            "created_to": _show(self.created_to),
        }
        return {k: v for k, v in values.items() if v}

    @property
    def status_text(self) -> str:
        """The status as the filter names it ("retrying" among them)."""
        if self.retrying:
            return RETRYING
        return self.status.value if self.status else ""

    def query(self, **extra: Any) -> str:
        return urlencode({**self.form(), **{k: v for k, v in extra.items() if v is not None}})

    @property
    def empty(self) -> bool:
        return not self.form()


def _show(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def clean(value: str, name: str) -> str:
    """Text a database column can hold: `InvalidInput` for a NUL character (text
    and jsonb refuse it), a lone surrogate (not UTF-8) or more than MAX_TEXT
    characters."""
    if len(value) > MAX_TEXT:
        raise InvalidInput(f"{name} is longer than {MAX_TEXT} characters")
    return limits.text(value, name)


def _clean_json(value: Any, name: str) -> Any:
    """A parsed JSON value whose every key and string `clean` accepts."""
    if isinstance(value, str):
        clean(value, name)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{name} holds a number JSON cannot store: {value}")
    elif isinstance(value, dict):
        for key, item in value.items():
            clean(key, name)
            _clean_json(item, name)
    elif isinstance(value, list):
        for item in value:
            _clean_json(item, name)
    return value


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name)
    return clean(value.strip(), name) or None if isinstance(value, str) else None


def _name(params: Mapping[str, str], field: str, what: str) -> str | None:
    """A filter naming a job type or key: whatever name a job can hold, as it is
    (white space and all, as the console's own links give it)."""
    value = params.get(field)
    if not isinstance(value, str) or not value.strip():
        return None
    return limits.name(value, what)


def parse_status(text: str | None) -> Status | None:
    if text is None:
        return None
    return Status.READY if text == RETRYING else status_named(text)


def parse_payload(text: str | None) -> dict[str, Any] | None:
    """A JSON object the payload must contain, or ``path=value`` (``a.b=1``):
    the value is JSON when it parses as JSON, else a string."""
    if text is None:
        return None
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                f"payload filter is not valid JSON: {exc.msg} at position {exc.pos}"
            ) from None
        except ValueError as exc:  # e.g. an integer too long to convert
            raise InvalidInput(f"payload filter is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidInput("payload filter must be a JSON object or key=value")
        return _clean_json(value, "payload")
    path, sep, raw = text.partition("=")
    keys = path.strip().split(".")
    if not sep or not all(k.strip() for k in keys):
        raise InvalidInput(
            f"payload filter {text!r} is neither a JSON object nor key=value"
            ' (like to=a@b.c or {"n": 1})'
        )
    try:
        value = json.loads(raw.strip())
    except ValueError:
        value = raw.strip()
    for key in reversed(keys):
        value = {key.strip(): value}
    return _clean_json(value, "payload")


def parse_instant(text: str | None, name: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{name} is not an ISO-8601 time like 2030-03-14T15:30: {text!r}"
        ) from None
    return limits.instant(value if value.tzinfo else value.replace(tzinfo=UTC), name)


def parse_filter(params: Mapping[str, str]) -> JobFilter:
    payload_text = _text(params, "payload")
    status = _text(params, "status")
    created_from = parse_instant(_text(params, "created_from"), "created_from")
    created_to = parse_instant(_text(params, "created_to"), "created_to")
    if created_from and created_to and created_from >= created_to:
        raise InvalidInput("created_from must be before created_to")
    return JobFilter(
        status=parse_status(status),
        retrying=(status or "").lower() == RETRYING,
        error=_text(params, "error"),
        type=_name(params, "type", "job type"),
        key=_name(params, "key", "an idempotency key"),
        payload=parse_payload(payload_text),
        payload_text=payload_text or "",
        created_from=created_from,
        created_to=created_to,
    )


def decimal_number(text: str) -> float:
    """`limits.number_text` without a sign: a form's number of seconds."""
    if text.startswith("-"):
        raise ValueError(f"not a number: {text!r}")
    return limits.number_text(text)


def parse_id(text: str | None, name: str = "id") -> int | None:
    """A job id (or cursor): a whole number from 1 to 2**63-1."""
    if text is None or not text.strip():
        return None
    try:
        value = limits.whole_text(text.strip())
    except ValueError:
        raise InvalidInput(f"{name} is not a whole number: {text[:40]!r}") from None
    if not 1 <= value <= MAX_ID:
        raise InvalidInput(f"{name} must be between 1 and {MAX_ID}, not {text[:40]}")
    return value


def parse_page_size(text: str | None) -> int:
    if text is None or not text.strip():
        return DEFAULT_PAGE_SIZE
    try:
        value = limits.whole_text(text.strip())
    except ValueError:
        raise InvalidInput(f"limit is not a whole number: {text[:40]!r}") from None
    if value not in PAGE_SIZES:
        raise InvalidInput(f"limit must be between 1 and {PAGE_SIZES[-1]}, not {value}")
    return value


def parse_priority(text: str | None) -> int:
    if text is None or not text.strip():
        raise InvalidInput("give the new priority: a whole number from 0 to 9")
    try:
        value = limits.whole_text(text.strip())
    except ValueError:
        raise InvalidInput(f"priority must be a whole number from 0 to 9, not {text!r}") from None
    return limits.priority(value)
