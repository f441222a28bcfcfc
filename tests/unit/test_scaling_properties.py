"""Properties of the WorkerPool policy over whole runs of polls (hypothesis).

Whatever the queue does from poll to poll, a decision that raises the replicas
stays within what the jobs could use and within one step; a hold changes
nothing; the bounds always hold.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rota_operator.scaling import (
    HOLDS,
    PoolLimits,
    QueueSample,
    ScaleMemory,
    decide,
    scale_up_step,
)

limits_st = st.builds(
    lambda low, span, target, window, per: PoolLimits(low, low + span, target, window, per),
    st.integers(0, 5),
    st.integers(0, 40),
    st.floats(1, 600),
    st.floats(0, 900),
    st.integers(1, 16),
)


@st.composite
def samples(draw: st.DrawFn) -> QueueSample:
    ready = draw(st.integers(0, 200))
    running = draw(st.integers(0, 200))
    held = draw(st.integers(0, running))
    slots = draw(st.integers(1, 16))
    busy = draw(st.integers(0, held))
    age = draw(st.floats(0, 100_000)) if ready else 0.0
    return QueueSample(age, ready, running, held, busy, slots)


@settings(max_examples=300, deadline=None)
@given(
    limits_st,
    st.integers(0, 60),
    st.lists(st.tuples(samples(), st.floats(0.5, 120)), min_size=1, max_size=30),
)
def test_growth_is_bounded_by_the_jobs_and_by_one_step(
    limits: PoolLimits, start: int, polls: list[tuple[QueueSample, float]]
) -> None:
    current, memory, now = start, ScaleMemory(), 0.0
    for sample, gap in polls:
        now += gap
        decision = decide(limits, current, sample, memory, now)
        desired = decision.desired
        assert limits.min_replicas <= desired <= limits.max_replicas
        if desired > current:
            allowed = max(sample.cap(limits.jobs_per_replica), sample.floor, limits.min_replicas)
            assert desired <= allowed, decision.message
            unforced = desired > max(sample.floor, limits.min_replicas)
            assert not unforced or desired <= current + scale_up_step(current), decision.message
        if desired < current:
            assert desired >= min(sample.floor, limits.max_replicas), decision.message
        current, memory = desired, decision.memory


@settings(max_examples=200, deadline=None)
@given(limits_st, st.integers(0, 60), samples(), st.sampled_from(HOLDS))
def test_a_hold_keeps_the_replicas_found(
    limits: PoolLimits, current: int, sample: QueueSample, hold: str
) -> None:
    decision = decide(limits, current, sample, ScaleMemory(), 10.0, hold=hold)
    assert (decision.desired, decision.reason) == (current, hold)
    assert decision.message.startswith(f"{hold}: {current} -> {current} replicas")


@pytest.mark.parametrize("per", [1, 4, 10])
def test_old_jobs_and_slow_pods_never_run_away(per: int) -> None:
    """Three old ready jobs, pods that never get ready: the pool asks for the
    replicas the three jobs can use, poll after poll, not maxReplicas."""
    limits = PoolLimits(0, 10, 30, 300, per)
    current, memory = 0, ScaleMemory()
    for poll in range(40):
        sample = QueueSample(600.0 + 15 * poll, 3)  # nobody starts them
        decision = decide(limits, current, sample, memory, 15.0 * poll)
        current, memory = decision.desired, decision.memory
    assert current == math.ceil(3 / per)
    assert decision.reason == "CappedByJobs"
