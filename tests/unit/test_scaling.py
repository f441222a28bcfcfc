"""The WorkerPool scaling policy, decided poll by poll with an injected clock."""

from __future__ import annotations

import pytest

from rota_operator.scaling import Decision, PoolLimits, QueueSample, ScaleMemory, decide

LIMITS = PoolLimits(
    min_replicas=0, max_replicas=20, target_age_seconds=30, stabilization_seconds=60
)


def poll(
    current: int,
    age: float,
    ready: int,
    *,
    limits: PoolLimits = LIMITS,
    memory: ScaleMemory | None = None,
    now: float = 1000.0,
) -> Decision:
    return decide(limits, current, QueueSample(age, ready), memory or ScaleMemory(), now)


@pytest.mark.parametrize(
    ("current", "age", "ready", "limits", "desired", "reason"),
    [
        pytest.param(0, 0.0, 0, LIMITS, 0, "QueueEmpty", id="empty queue stays at zero"),
        pytest.param(0, 0.0, 1, LIMITS, 1, "ScaleFromZero", id="0 -> 1 at the first ready job"),
        pytest.param(0, 300.0, 50, LIMITS, 4, "ScaleFromZero", id="from zero, a bounded step"),
        pytest.param(2, 300.0, 80, LIMITS, 6, "QueueTooOld", id="burst: +4 at most from 2"),
        pytest.param(10, 45.0, 80, LIMITS, 15, "QueueTooOld", id="proportional to age/target"),
        pytest.param(10, 32.0, 80, LIMITS, 10, "QueueOnTarget", id="within the tolerance"),
        pytest.param(
            4,
            300.0,
            80,
            PoolLimits(0, 5, 30, 60),
            5,
            "QueueTooOld",
            id="growth clamped to max",
        ),
        pytest.param(
            0, 0.0, 0, PoolLimits(3, 5, 30, 60), 3, "QueueEmpty", id="empty queue clamped to min"
        ),
        pytest.param(
            50, 0.0, 0, PoolLimits(0, 20, 30, 600), 20, "OutOfBounds", id="above max at once"
        ),
    ],
)
def test_single_poll(
    current: int, age: float, ready: int, limits: PoolLimits, desired: int, reason: str
) -> None:
    decision = poll(current, age, ready, limits=limits)
    assert (decision.desired, decision.reason) == (desired, reason)


def test_grows_immediately_and_every_poll() -> None:
    memory = ScaleMemory()
    replicas = [1]
    for step in range(3):
        decision = poll(replicas[-1], 600.0, 500, memory=memory, now=1000.0 + 15 * step)
        memory = decision.memory
        replicas.append(decision.desired)
    assert replicas == [1, 5, 10, 20]


def test_shrinks_only_after_the_stabilization_window() -> None:
    first = poll(6, 30.0, 100, now=0.0)
    assert first.desired == 6
    memory, current = first.memory, first.desired
    replicas = []
    for now in range(15, 91, 15):  # the queue drained at t=15
        decision = poll(current, 0.0, 0, memory=memory, now=float(now))
        memory, current = decision.memory, decision.desired
        replicas.append((now, decision.desired, decision.reason))
    assert replicas[:3] == [(15, 6, "Stabilizing"), (30, 6, "Stabilizing"), (45, 6, "Stabilizing")]
    assert replicas[3] == (60, 0, "QueueEmpty")  # every recommendation of the last 60 s is 0
    assert replicas[4:] == [(75, 0, "QueueEmpty"), (90, 0, "QueueEmpty")]


def test_slow_drain_steps_down_to_the_highest_recent_recommendation() -> None:
    memory = ScaleMemory()
    current = 8
    seen = []
    for now, age in [(0, 60.0), (30, 20.0), (60, 10.0), (90, 5.0), (120, 5.0)]:
        decision = poll(current, age, 100, memory=memory, now=float(now))
        memory, current = decision.memory, decision.desired
        seen.append(current)
    # 100 ready jobs: enough work that the cap of rule 2 does not bind.
    # t=0 grows (age/target = 2: 8 -> 16); t=30 holds (60 s not yet observed); from t=60 on,
    # each poll shrinks to the highest recommendation of the last 60 s: 11 (t=30), 6, 2.
    assert seen == [16, 16, 11, 6, 2]


def test_never_below_one_while_jobs_are_ready() -> None:
    memory = ScaleMemory(window_start=0.0, recommendations=(), last_desired=5)
    decision = poll(5, 0.1, 3, memory=memory, now=1000.0)
    assert decision.desired == 1


def test_a_manual_change_restarts_the_window() -> None:
    memory = ScaleMemory(window_start=0.0, recommendations=((990.0, 0),), last_desired=2)
    decision = poll(8, 0.0, 0, memory=memory, now=1000.0)
    assert (decision.desired, decision.reason) == (8, "Stabilizing")
    later = poll(8, 0.0, 0, memory=decision.memory, now=1060.0)
    assert later.desired == 0


def test_a_manual_change_above_max_is_clamped_once() -> None:
    memory = ScaleMemory(window_start=0.0, last_desired=3)
    decision = poll(40, 0.0, 5, memory=memory, now=1000.0)
    assert (decision.desired, decision.reason) == (20, "OutOfBounds")


def test_zero_stabilization_shrinks_at_once() -> None:
    limits = PoolLimits(1, 10, 30, 0)
    decision = poll(7, 0.0, 0, limits=limits)
    assert (decision.desired, decision.reason) == (1, "QueueEmpty")


def test_the_message_carries_the_numbers() -> None:
    decision = poll(2, 90.0, 12)
    assert decision.message.startswith("QueueTooOld: 2 -> 6 replicas; 12 ready jobs")
    assert "oldest waiting 90.0s (target 30s)" in decision.message


def test_a_busy_pool_whose_queue_is_always_drained_keeps_one_worker() -> None:
    from rota_operator.scaling import recommend

    busy = QueueSample(oldest_ready_age_seconds=0.0, ready_jobs=0, running_jobs=3)
    idle = QueueSample(oldest_ready_age_seconds=0.0, ready_jobs=0, running_jobs=0)
    assert recommend(LIMITS, 2, busy) == (1, "JobsRunning")
    assert recommend(LIMITS, 2, idle)[1] == "QueueEmpty"


# -- jobs in flight: a floor that no other rule goes below ------------------------


def busy(held: int, replicas: int, slots: int = 1, ready: int = 0, age: float = 0.0) -> QueueSample:
    return QueueSample(age, ready, held, held, replicas, slots)


def test_long_jobs_on_an_empty_queue_hold_every_busy_replica() -> None:
    # Four workers each running a long job, nothing ready: after the window the
    # old policy sent the pool to 1 and stopped three jobs mid-way.
    memory, current, seen = ScaleMemory(), 4, []
    for now in range(0, 601, 15):
        decision = decide(LIMITS, current, busy(4, 4), memory, float(now))
        memory, current = decision.memory, decision.desired
        seen.append((decision.desired, decision.reason))
    assert {d for d, _ in seen} == {4}
    assert seen[-1] == (4, "JobsRunning")


def test_the_floor_is_the_running_jobs_over_the_slots_per_replica() -> None:
    # 10 jobs on workers of 4 slots need ceil(10 / 4) = 3 replicas; 6 run.
    memory = ScaleMemory(window_start=0.0, last_desired=6)
    decision = decide(LIMITS, 6, busy(10, 3, slots=4), memory, 1000.0)
    assert (decision.desired, decision.reason) == (3, "JobsRunning")
    # Spread over 5 pods, each of them is busy: none may go.
    decision = decide(LIMITS, 6, busy(10, 5, slots=4), memory, 1000.0)
    assert (decision.desired, decision.reason) == (5, "JobsRunning")


def test_replicas_step_down_only_as_jobs_finish() -> None:
    # Without a stabilization window each finished job frees its replica at once;
    # with one, the pool keeps the highest need of the window, as for the queue.
    for limits, expected in [
        (PoolLimits(0, 20, 30, 0), [4, 3, 3, 1, 0, 0]),
        (LIMITS, [4, 4, 4, 4, 3, 3]),
    ]:
        memory, current, seen = ScaleMemory(window_start=0.0, last_desired=4), 4, []
        for now, held in [(1000, 4), (1015, 3), (1030, 3), (1045, 1), (1060, 0), (1075, 0)]:
            decision = decide(limits, current, busy(held, held), memory, float(now))
            memory, current = decision.memory, decision.desired
            seen.append(current)
        assert seen == expected, limits


def test_the_queue_age_rule_scales_above_the_floor() -> None:
    memory = ScaleMemory(window_start=0.0, last_desired=3)
    decision = decide(LIMITS, 3, busy(3, 3, ready=40, age=90.0), memory, 1000.0)
    assert (decision.desired, decision.reason) == (7, "QueueTooOld")  # 3 * 90/30, +4 at most
    young = decide(LIMITS, 3, busy(3, 3, ready=2, age=1.0), memory, 1000.0)
    assert (young.desired, young.reason) == (3, "JobsRunning")  # young queue, jobs hold 3


def test_max_replicas_bounds_the_floor_too() -> None:
    limits = PoolLimits(0, 2, 30, 60)
    decision = decide(limits, 2, busy(5, 5), ScaleMemory(), 1000.0)
    assert (decision.desired, decision.reason) == (2, "OutOfBounds")


def test_the_message_says_what_the_jobs_in_flight_need() -> None:
    decision = decide(LIMITS, 6, busy(10, 5, slots=4), ScaleMemory(), 1000.0)
    assert "10 running, 10 on 5 busy replicas of 4 slots: at least 5" in decision.message


def test_growth_stops_at_what_the_jobs_can_use() -> None:
    """Ten old jobs, four per replica: three replicas, however old the jobs get."""
    limits = PoolLimits(0, 20, 30, 60, jobs_per_replica=4)
    decision = decide(limits, 2, QueueSample(3000.0, 10), ScaleMemory(), 0.0)
    assert (decision.desired, decision.reason) == (3, "CappedByJobs")
    assert "at most 3 at 4 jobs per replica, +4 per decision" in decision.message


def test_running_jobs_count_towards_the_cap() -> None:
    limits = PoolLimits(0, 20, 30, 60, jobs_per_replica=2)
    decision = decide(limits, 1, QueueSample(3000.0, 2, running_jobs=6), ScaleMemory(), 0.0)
    assert decision.desired == 4  # ceil((2 + 6) / 2)


def test_the_step_bounds_growth_from_zero_and_from_many() -> None:
    assert decide(LIMITS, 0, QueueSample(9000.0, 500), ScaleMemory(), 0.0).desired == 4
    big = PoolLimits(0, 100, 30, 60)
    assert decide(big, 10, QueueSample(9000.0, 500), ScaleMemory(), 0.0).desired == 20


def test_a_paused_pool_keeps_its_replicas_and_forgets_its_window() -> None:
    grown = decide(LIMITS, 2, QueueSample(600.0, 50), ScaleMemory(), 0.0)
    held = decide(LIMITS, 6, QueueSample(0.0, 0), grown.memory, 15.0, hold="Paused")
    assert (held.desired, held.reason) == (6, "Paused")
    assert held.memory == ScaleMemory(last_desired=6)
