"""Random JobSchedule and WorkerPool specs: refused with a clear reason, never a crash.

The operator's handlers catch `InvalidInput` from `schedules.to_spec` (Ready=False,
InvalidSpec, no row written) and TypeError/ValueError/KeyError from
`PoolSpec.parse` (and AttributeError: Ready=False, InvalidSpec); anything else would be a handler
crashing and kopf retrying it for ever. A spec that is accepted is one the core
can store.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota import schedule_store as core
from rota.errors import InvalidInput
from rota_operator import jobschedules as schedules
from rota_operator import pools

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=int(os.environ.get("ROTA_PROPERTY_EXAMPLES") or 300),
    suppress_health_check=[HealthCheck.too_slow],
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
ODD = st.one_of(
    JSON,
    st.sampled_from(["", "0 9 * * *", "@hourly", "61 * * * *", "Europe/Berlin", "Nowhere/X"]),
    st.sampled_from(["Allow", "Forbid", "Replace", "-1", "1e9", "10"]),
    st.integers(-(2**70), 2**70),
)


def specs(fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(fields), ODD, max_size=len(fields))


SCHEDULE_FIELDS = [
    "jobType", "schedule", "timeZone", "payload", "suspend", "spreadSeconds",
    "concurrencyPolicy", "startingDeadlineSeconds", "maxAttempts",
]  # fmt: skip
POOL_FIELDS = [
    "scaleTargetRef", "jobTypes", "minReplicas", "maxReplicas", "targetQueueAgeSeconds",
    "scaleDownStabilizationSeconds", "pollIntervalSeconds",
]  # fmt: skip


@FUZZ
@given(specs(SCHEDULE_FIELDS), st.sampled_from(["default", "team-a"]), st.text(max_size=10))
def test_a_jobschedule_spec_is_a_schedule_or_invalid_input(
    spec: dict[str, Any], namespace: str, name: str
) -> None:
    try:
        result = schedules.to_spec(namespace, name or "x", spec)
    except InvalidInput as exc:
        message = str(exc)
        assert message and "\n" not in message
        status = schedules.invalid_status({}, 1, message)
        assert status["conditions"][0]["status"] == "False"
        assert status["conditions"][0]["reason"] == "InvalidSpec"
        return
    core.validate(result)  # what upsert checks again before writing


@FUZZ
@given(specs(POOL_FIELDS), st.sampled_from([15.0, 1.0]))
def test_a_workerpool_spec_parses_or_fails_the_way_poll_once_catches(
    spec: dict[str, Any], default_poll: float
) -> None:
    try:
        parsed = pools.PoolSpec.parse(spec, default_poll)
    except (TypeError, ValueError, KeyError, AttributeError):
        return
    assert isinstance(parsed.target, str)
    assert parsed.poll_interval_seconds == parsed.poll_interval_seconds  # not nan


@pytest.mark.parametrize(
    "spec",
    [
        {"jobType": "t", "schedule": "@daily", "spreadSeconds": "soon"},  # was ValueError
        {"jobType": "t", "schedule": "@daily", "spreadSeconds": [1]},  # was TypeError
        {"jobType": "t", "schedule": "@daily", "timeZone": True},  # was AttributeError
        {"jobType": "t", "schedule": "@daily", "payload": {"x": math.nan}},  # PostgreSQL refused
        # Stored, then refused by the archiver at every run:
        {"jobType": "rota.archive", "schedule": "@daily", "payload": {"batch_size": "many"}},
    ],
)
def test_specs_that_crashed_the_handler_are_invalid(spec: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        schedules.to_spec("default", "s", spec)


def test_a_pool_whose_target_ref_is_not_an_object_or_poll_is_nan_is_refused() -> None:
    for spec in ({"scaleTargetRef": "workers"}, {"pollIntervalSeconds": math.nan}):
        with pytest.raises((AttributeError, ValueError)):
            pools.PoolSpec.parse(spec, 15.0)
