"""How a claim's rows are read: the two loaders that cost most, made cheaper.

A claimed job's row carries a jsonb payload and four or five timestamps. With
psycopg's defaults, the payload goes through `json.loads` on bytes (which first
guesses the encoding: 3.4 us for `{"i": 1}`) and every timestamp is moved into
the session's time zone by `astimezone` (0.9 us for a `ZoneInfo` such as
Etc/UTC, 0.3 for `timezone.utc`): about a quarter of what reading a claim costs
its I/O thread. The claim's cursor reads the payload from the text PostgreSQL
sends (always one JSON value, nothing around it) and the timestamps in UTC.
Both give the same values (the same instants: `2026-01-01 10:00+01` and
`09:00+00` are equal datetimes); the timestamps' `tzinfo` is `timezone.utc`
whatever the server's TimeZone.

A connection whose jsonb or timestamptz loader is not psycopg's own (its
application registered one, or changed `json.loads` globally) keeps its own.
"""

from __future__ import annotations

import json
from typing import Any, cast

from psycopg import Cursor, adapters, pq
from psycopg.adapt import Buffer, Loader
from psycopg.postgres import types as pg_types
from psycopg.types.json import JsonbBinaryLoader

from rota.db import Conn

_JSONB = pg_types["jsonb"].oid
_TIMESTAMPTZ = pg_types["timestamptz"].oid
_BINARY = pq.Format.BINARY

_DEFAULT_TIMESTAMPTZ = cast("type[Loader]", adapters.get_loader(_TIMESTAMPTZ, _BINARY))
"""psycopg's binary timestamptz loader (its C one when psycopg[binary] is installed)."""

_raw_decode = json.JSONDecoder().raw_decode


class UtcTimestamptz(Loader):
    """psycopg's own binary timestamptz loader, made without a connection: it then
    gives UTC datetimes and skips the move into the session's time zone.

    Its C class cannot be subclassed: this class only makes one (and has no
    `load` of its own, hence the cast where it is registered)."""

    format = _BINARY

    def __new__(cls, oid: int, context: Any = None) -> Any:
        return _DEFAULT_TIMESTAMPTZ(oid, None)


class JsonbText(JsonbBinaryLoader):
    """A jsonb value from the text PostgreSQL sends: one JSON value with nothing
    around it, so no encoding to guess and no whitespace to skip (anything else
    goes to `json.loads`, which reads or refuses it as before)."""

    def load(self, data: Buffer) -> Any:
        if not data or data[0] != 1:
            return super().load(data)  # an empty or unknown format: psycopg's own error
        text = str(data[1:], "utf-8")
        try:
            value, end = _raw_decode(text)
        except ValueError:
            end = -1
        if end != len(text):  # not one bare value: json.loads accepts it or says why not
            value = json.loads(text)
        return value


def claim_cursor(conn: Conn, row_factory: Any) -> Cursor[Any]:
    """A cursor of `conn` reading a claim's rows with the loaders above (where the
    connection's own are psycopg's defaults)."""
    cur = Cursor(conn, row_factory=row_factory)
    own = conn.adapters
    if own.get_loader(_TIMESTAMPTZ, _BINARY) is _DEFAULT_TIMESTAMPTZ:
        cur.adapters.register_loader(_TIMESTAMPTZ, cast("type[Loader]", UtcTimestamptz))
    if own.get_loader(_JSONB, _BINARY) is JsonbBinaryLoader and _default_json_loads():
        cur.adapters.register_loader(_JSONB, JsonbText)
    return cur


def _default_json_loads() -> bool:
    """Whether psycopg reads JSON with `json.loads` (nobody set another globally)."""
    return JsonbBinaryLoader._loads is json.loads
