"""A payload's size as Python counts it is the size the database counts
(`octet_length(payload::text)`: a space after each `,` and `:`, numbers
written out in full), so that the two refuse the same payloads. A payload the
database would refuse after Python passed it aborted the caller's
transaction, and a caller that caught the refusal and committed lost its own
rows."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rota
from rota import limits
from rota.errors import InvalidInput

TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8)
NUMBERS = st.one_of(
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e300, -1e-300, 1.5e-7, 1e16, 5e-324, -0.0, 0.1, 123456.789]),
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


def stored_bytes(conn: psycopg.Connection[Any], encoded: str) -> int:
    row = conn.execute("SELECT octet_length(%s::jsonb::text) AS n", (encoded,)).fetchone()
    assert row is not None
    return int(row["n"])


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=JSON)
def test_python_counts_a_payload_as_the_database_prints_it(
    conn: psycopg.Connection[Any], value: Any
) -> None:
    encoded = limits.encode_value(value, "value")
    assert limits.stored_bytes(value) == stored_bytes(conn, encoded)


@pytest.mark.parametrize(
    "payload",
    [
        {"n": [0] * 100_000},  # 200,007 bytes compact, 300,006 as printed
        {"n": [1e300] * 900},  # 6 bytes a number compact, 301 as printed
        {f"k{i}": i for i in range(30_000)},
    ],
)
def test_a_payload_the_database_would_refuse_is_refused_first_and_the_transaction_goes_on(
    db_url: str, payload: Any
) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("CREATE TEMP TABLE business (n int)")
        conn.execute("INSERT INTO business VALUES (1)")
        with pytest.raises(InvalidInput, match="over the limit of 262144 bytes"):
            rota.enqueue(conn, "t", payload)
        # Python refused before the database was asked: the caller's transaction goes on.
        assert conn.execute("SELECT count(*) FROM business").fetchone() == (1,)


def test_a_payload_at_the_edge_as_printed_is_taken_by_both(conn: psycopg.Connection[Any]) -> None:
    # {"x": "aaa..."} prints as 9 bytes around the string.
    edge = {"x": "a" * (limits.MAX_PAYLOAD_BYTES - 9)}
    assert limits.stored_bytes(edge) == limits.MAX_PAYLOAD_BYTES
    rota.enqueue(conn, "t", edge)
    over = {"x": "a" * (limits.MAX_PAYLOAD_BYTES - 8)}
    with pytest.raises(InvalidInput, match="payload is 262145 bytes"):
        rota.enqueue(conn, "t", over)
