"""A claim reads its rows with cheaper loaders (rota.decoding): the same values as
psycopg's own, timestamps in UTC whatever the server's time zone, and an
application's own loaders left in place."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.errors import DataError
from psycopg.postgres import types as pg_types
from psycopg.types.json import Jsonb, set_json_loads

import rota
from rota import claim as claims
from rota.decoding import JsonbText
from rota.lookup import get_job

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))  # jsonb: no \u0000
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=st.dictionaries(_TEXT, _JSON, max_size=5))
def test_a_claimed_payload_reads_as_psycopg_reads_it(
    conn: psycopg.Connection[Any], payload: dict[str, Any]
) -> None:
    job_id = rota.enqueue(conn, "t", payload, now=T0)
    _, [claimed] = claims.write_and_claim(conn, "w", [], 1, 30, now=T0 + timedelta(seconds=1))
    expected = conn.execute("SELECT payload FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert claimed.payload == expected["payload"]  # type: ignore[index]
    conn.execute("DELETE FROM rota.job WHERE id = %s", (job_id,))


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/St_Johns", "Etc/UTC", "UTC"])
def test_claimed_timestamps_are_utc_whatever_the_servers_time_zone(
    conn: psycopg.Connection[Any], zone: str
) -> None:
    conn.execute(f"SET TIME ZONE '{zone}'")
    job_id = rota.enqueue(conn, "t", now=T0)
    rota.enqueue(conn, "t", now=T0)
    later = T0 + timedelta(seconds=1)
    [claimed] = claims.claim(conn, "w", 1, 30, now=later)
    _, [again] = claims.write_and_claim(conn, "w", [], 1, 30, now=later)
    for job in (claimed, again):
        assert (job.run_at, job.started_at) == (T0, later)
        assert job.run_at.tzinfo is UTC and job.started_at.tzinfo is UTC  # type: ignore[union-attr]
    # Read on its own, the row keeps the session's zone: only the claim's cursor changed.
    read = get_job(conn, job_id)
    assert read is not None and read.run_at == T0 and str(read.run_at.tzinfo) == zone


def test_a_connections_own_json_loads_is_kept(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        set_json_loads(functools.partial(json.loads, parse_float=Decimal), conn)
        rota.enqueue(conn, "t", {"price": 1.25}, now=T0)
        [claimed] = claims.claim(conn, "w", 1, 30, now=T0 + timedelta(seconds=1))
    assert claimed.payload == {"price": Decimal("1.25")}


def test_a_connections_own_timestamp_loader_is_kept(db_url: str) -> None:
    class Stamp(psycopg.adapt.Loader):
        format = psycopg.pq.Format.BINARY

        def load(self, data: Any) -> str:
            return "stamp"

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.adapters.register_loader(pg_types["timestamptz"].oid, Stamp)
        rota.enqueue(conn, "t", now=T0)
        [claimed] = claims.claim(conn, "w", 1, 30, now=T0 + timedelta(seconds=1))
    assert claimed.run_at == "stamp"


def test_the_jsonb_loader_refuses_what_is_not_one_json_value() -> None:
    loader = JsonbText(pg_types["jsonb"].oid)
    assert loader.load(b'\x01{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    assert loader.load(memoryview(b"\x01 [1] ")) == [1]  # spaces around: as json.loads
    with pytest.raises(DataError, match="unknown jsonb binary format"):
        loader.load(b"\x02{}")
    with pytest.raises(json.JSONDecodeError, match="Extra data"):
        loader.load(b"\x01{} {}")
    with pytest.raises(json.JSONDecodeError):
        loader.load(b"\x01{")


def test_a_payload_of_jsonb_text_with_every_escape_reads_back(
    conn: psycopg.Connection[Any],
) -> None:
    odd = {"s": 'quote " back \\ tab \t nl \n nul-free \u2028 ☃ 𝄞', "n": -0.0, "big": 10**40}
    rota.enqueue(conn, "t", odd, now=T0)
    [claimed] = claims.claim(conn, "w", 1, 30, now=T0 + timedelta(seconds=1))
    expected = conn.execute("SELECT %s::jsonb AS p", (Jsonb(odd),)).fetchone()
    assert claimed.payload == expected["p"]  # type: ignore[index]


@pytest.mark.parametrize("pipeline", [False, True], ids=["claim", "write_and_claim"])
def test_a_row_that_cannot_be_read_is_claimed_as_unreadable_beside_the_others(
    conn: psycopg.Connection[Any], pipeline: bool
) -> None:
    # Written around any check (a plain UPDATE, triggers off): a payload deeper than Python's
    # recursion limit, and a timestamp past year 9999. The claim reads its other
    # rows as ever; each bad one is a job whose payload says what failed.
    from rota.decoding import Unreadable

    ids = rota.enqueue_many(conn, [rota.NewJob("t", {"n": n}) for n in range(4)])
    conn.execute("SET session_replication_role = replica")  # the table's triggers off
    conn.execute(
        "UPDATE rota.job SET payload = (repeat('[', 5000) || repeat(']', 5000))::jsonb"
        " WHERE id = %s",
        (ids[1],),
    )
    conn.execute("UPDATE rota.job SET created_at = 'infinity' WHERE id = %s", (ids[2],))
    conn.execute("RESET session_replication_role")
    if pipeline:
        _, jobs = claims.write_and_claim(conn, "w", [], 10, 30)
    else:
        jobs = claims.claim(conn, "w", 10, 30)
    by_id = {job.id: job for job in jobs}
    assert sorted(by_id) == ids
    assert [by_id[i].payload for i in (ids[0], ids[3])] == [{"n": 0}, {"n": 3}]
    deep, infinite = by_id[ids[1]].payload, by_id[ids[2]].payload
    assert isinstance(deep, Unreadable) and deep.reason.startswith("payload: RecursionError")
    assert isinstance(infinite, Unreadable)
    assert infinite.reason.startswith("created_at: DataError")
    assert by_id[ids[1]].attempts == 1 and by_id[ids[1]].type == "t"


@pytest.mark.parametrize("pipeline", [False, True], ids=["claim", "write_and_claim"])
def test_a_trace_context_that_cannot_be_read_is_dropped_and_the_job_runs(
    conn: psycopg.Connection[Any], pipeline: bool
) -> None:
    """The trace context is tracing data only, and no check of the table guards
    it: a job whose context cannot be read (nested past Python's recursion
    limit) is claimed with none, its payload and every other column as stored."""
    ids = rota.enqueue_many(conn, [rota.NewJob("t", {"n": n}) for n in range(3)])
    conn.execute(
        "UPDATE rota.job SET trace_context = (repeat('[', 5000) || repeat(']', 5000))::jsonb"
        " WHERE id = %s",
        (ids[1],),
    )
    if pipeline:
        _, jobs = claims.write_and_claim(conn, "w", [], 10, 30)
    else:
        jobs = claims.claim(conn, "w", 10, 30)
    by_id = {job.id: job for job in jobs}
    assert [by_id[i].payload for i in ids] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert by_id[ids[1]].trace_context is None
    assert by_id[ids[1]].type == "t" and by_id[ids[1]].claims == 1
