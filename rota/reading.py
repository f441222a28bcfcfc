"""Reading rows that Python's types cannot hold, without failing the read.

PostgreSQL holds times Python's `datetime` cannot (infinity, the year 20000,
years before 1), spans `timedelta` cannot, and JSON nested deeper than Python's
JSON reader recurses. Rota's checks keep such values out of its tables
(migration 0024), but a row written around them (by a superuser with triggers
off, or before the checks existed) must not crash a listing, `rota status`, a
console page or a maintenance loop: one row never blocks the rest.

`fetch_all` reads with the loaders below. A value that cannot be read comes back
as a stand-in carrying PostgreSQL's own text: `RawInstant` (a `datetime` at the
edge of `datetime`'s range, so comparisons and sorting keep working),
`RawSpan` (the same for `timedelta`) and `RawJson` (a `str`). Each prints as the
raw text. Loaders an application registered on its connection are left alone.
Never used to write: these classes are only what a reader shows.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from psycopg import AsyncCursor, Cursor, DataError, adapters, pq
from psycopg.adapt import AdaptersMap, Buffer, Loader
from psycopg.postgres import types as pg_types
from psycopg.types.json import JsonbLoader, JsonLoader

_TEXT = pq.Format.TEXT


class RawInstant(datetime):
    """A time PostgreSQL holds that `datetime` cannot: it compares as the latest
    (or earliest) `datetime` and shows as PostgreSQL's text (`infinity`)."""

    raw: str

    def __new__(cls, raw: str, late: bool) -> RawInstant:
        edge = datetime.max if late else datetime.min
        made = super().__new__(
            cls, edge.year, edge.month, edge.day, edge.hour, edge.minute, edge.second,
            edge.microsecond, tzinfo=UTC,
        )  # fmt: skip
        made.raw = raw
        return made

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return self.raw

    def astimezone(self, tz: Any = None) -> RawInstant:
        return self  # a move to another zone could leave datetime's range

    def __str__(self) -> str:
        return self.raw

    def __repr__(self) -> str:
        return f"RawInstant({self.raw!r})"

    def __format__(self, spec: str) -> str:
        return self.raw

    def __reduce__(self) -> Any:
        return (RawInstant, (self.raw, self.year > 1))

    def __reduce_ex__(self, protocol: Any) -> Any:
        # datetime's own would win over __reduce__ (copy, deepcopy, pickle) and
        # rebuild this one from datetime's state: bytes where its text goes.
        return self.__reduce__()


class RawSpan(timedelta):
    """A span PostgreSQL holds that `timedelta` cannot: the longest (or most
    negative) `timedelta`, shown as PostgreSQL's text."""

    raw: str

    def __new__(cls, raw: str, positive: bool) -> RawSpan:
        edge = timedelta.max if positive else timedelta.min
        made = super().__new__(cls, edge.days, edge.seconds, edge.microseconds)
        made.raw = raw
        return made

    def __str__(self) -> str:
        return self.raw

    def __repr__(self) -> str:
        return f"RawSpan({self.raw!r})"

    def total_seconds(self) -> float:
        return float("inf") if self > timedelta(0) else float("-inf")

    def __reduce__(self) -> Any:
        return (RawSpan, (self.raw, self > timedelta(0)))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__reduce__()


class RawJson(str):
    """A JSON value Python cannot read back (nested past its recursion limit): the
    text PostgreSQL printed."""

    __slots__ = ()


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 and C1 control characters, DEL, and the line and paragraph separators."""


def shown(text: str) -> str:
    """`text` for a terminal: each control character escaped as Python's repr
    writes it (a line break as \\n, ESC as \\x1b), so a value can neither move
    the cursor nor break a table's line. JSON output keeps the exact text."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


def json_of(text: str) -> Any:
    """A JSON value from PostgreSQL's text of it; `RawJson` (the text) where
    Python cannot read it back (nested past its recursion, an integer of more
    digits than `int` converts)."""
    try:
        return json.loads(text)
    except (RecursionError, ValueError):
        return RawJson(text)


def _text(data: Buffer) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def _early(text: str, exc: Exception) -> bool:
    return text.startswith("-") or text.endswith(" BC") or "small" in str(exc)


class _Wrapping(Loader):
    """psycopg's own text loader for the type (its C class cannot be subclassed),
    with what it refuses turned into a stand-in."""

    format = _TEXT
    _inner: type[Loader]

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._loader = self._inner(oid, context)

    def load(self, data: Buffer) -> Any:
        try:
            return self._loader.load(data)
        except (DataError, OverflowError, ValueError) as exc:
            return self.stand_in(_text(data), exc)

    def stand_in(self, text: str, exc: Exception) -> Any:
        raise NotImplementedError


def _default(name: str) -> type[Loader]:
    return cast("type[Loader]", adapters.get_loader(pg_types[name].oid, _TEXT))


class TolerantTimestamptz(_Wrapping):
    _inner = _default("timestamptz")

    def stand_in(self, text: str, exc: Exception) -> Any:
        return RawInstant(text, late=not _early(text, exc))


class TolerantInterval(_Wrapping):
    _inner = _default("interval")

    def stand_in(self, text: str, exc: Exception) -> Any:
        return RawSpan(text, positive=not _early(text, exc))


class TolerantJsonb(JsonbLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except (RecursionError, ValueError):
            return RawJson(_text(data))


class TolerantJson(JsonLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except (RecursionError, ValueError):
            return RawJson(_text(data))


_TIMESTAMPTZ = pg_types["timestamptz"].oid

_TOLERANT: dict[str, tuple[type[Loader], type[Loader]]] = {
    "timestamptz": (TolerantTimestamptz._inner, TolerantTimestamptz),
    "interval": (TolerantInterval._inner, TolerantInterval),
    "jsonb": (JsonbLoader, TolerantJsonb),
    "json": (JsonLoader, TolerantJson),
}


CursorT = TypeVar("CursorT", Cursor[Any], AsyncCursor[Any])


def make_tolerant(adapters_map: AdaptersMap) -> None:
    """Register the loaders above on a connection (or cursor) where its loaders
    are psycopg's own: once per connection Rota opens, so its statements pay
    nothing for them."""
    for name, (default, loader) in _TOLERANT.items():
        oid = pg_types[name].oid
        if adapters_map.get_loader(oid, _TEXT) is default:
            adapters_map.register_loader(oid, loader)


def tolerant(cur: CursorT) -> CursorT:
    """`cur` reading with the loaders above: its connection's when Rota opened it,
    else registered on this cursor alone (a caller's connection is not changed)."""
    if cur.connection.adapters.get_loader(_TIMESTAMPTZ, _TEXT) is not TolerantTimestamptz:
        make_tolerant(cur.adapters)
    return cur
