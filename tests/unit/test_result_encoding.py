"""A result's JSON: the scalars that skip the walk encode as json.dumps does,
and stay under the size limit like any other value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rota import limits
from rota.errors import InvalidInput

SCALARS = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)


@given(value=SCALARS, max_bytes=st.integers(min_value=1, max_value=30))
def test_a_scalar_encodes_as_json_does_within_the_limit(value: Any, max_bytes: int) -> None:
    expected = json.dumps(value, separators=(",", ":"))
    if len(expected) <= max_bytes:
        assert limits.encode_result(value, max_bytes) == expected
    else:
        with pytest.raises(InvalidInput, match="over the limit"):
            limits.encode_result(value, max_bytes)


def test_a_bool_is_not_taken_for_an_int() -> None:
    assert [limits.encode_result(v) for v in (True, False, 1, 0)] == ["true", "false", "1", "0"]
