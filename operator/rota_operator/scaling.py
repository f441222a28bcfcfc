"""How many workers a pool needs, decided from its jobs in flight and the age of its queue.

This module is pure: no clock, no database, no Kubernetes. The caller passes the
time (`now`, in seconds on any monotonic-enough scale) and what it remembers
from the previous poll, and gets back a decision and the memory for the next
poll. That is what lets the tests walk through minutes of stabilization in
microseconds.

The policy, one poll at a time:

0. A hold comes first: a paused pool (`spec.paused`) or one whose target has
   another controller (a second WorkerPool, an HPA, a KEDA ScaledObject) keeps
   the replicas it finds, decides nothing else and says why (`Paused`,
   `ConflictingController`).
1. Jobs in flight set a floor: never fewer replicas than the pool's running
   jobs need, ceil(jobs held by its live workers / slots per replica), nor
   than the replicas that hold one (`JobsRunning`); its workers are those of
   the target's pods only (pools.py). Every other rule decides
   above it, immediately: a scale-down removes only replicas that would be
   idle, and the operator marks the busy pods so that Kubernetes stops an idle
   one (see pools.py).
2. Jobs set a ceiling: a recommendation never exceeds what the pool's jobs
   could use, ceil((ready + running) / jobsPerReplica) (`CappedByJobs`).
   Waiting jobs (status `waiting`) are neither ready nor running: they need no
   worker. So old jobs and pods slow to start (an image pull, a node being
   added) can at most give every job its slot, never a runaway to maxReplicas.
3. Empty queue: the recommendation is `minReplicas` (0 allowed) when no job
   of the pool is running either; while jobs run (workers keep up, so nothing
   waits), at least 1 and at least the floor.
4. Jobs ready and no replica: at least 1 at once (0 -> 1 never waits).
5. The oldest ready job older than `targetQueueAgeSeconds` (beyond a 10%
   tolerance): grow in proportion, `ceil(current * age / target)`, by at most
   `max(current, 4)` replicas per decision (`scale_up_step`: double or +4,
   like the Horizontal Pod Autoscaler's default scale-up policies).
6. The oldest ready job younger than the target: the recommendation shrinks in
   proportion too, but never below 1 while jobs are ready.
7. Growing happens at once. Shrinking waits: the pool only shrinks to the
   highest recommendation seen over the last `scaleDownStabilizationSeconds`,
   and not before that much time has been observed, so a brief lull after a
   burst does not send workers away. Since every recommendation is capped by
   rule 2, after the window the pool holds no more than its jobs needed then.
8. The result is clamped to [minReplicas, maxReplicas], immediately, whatever
   the window says.
9. A manual change of the Deployment's replicas (a value other than the one
   decided last time) restarts the stabilization window: the operator follows
   the new value as its base and does not undo it on the spot; it answers at
   most once per poll, since it only acts when it polls.

So every decision that raises the replicas keeps to
`desired <= max(cap, floor, minReplicas)` and `desired <= current + scale_up_step(current)`
(the floor and minReplicas excepted): tests/unit/test_scaling_properties.py checks both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TOLERANCE = 0.1
"""Age within 10% of the target counts as on target: no change (avoids flapping)."""

MIN_STEP_UP = 4
"""Growth per decision is at most max(current replicas, this)."""

HOLDS = ("Paused", "ConflictingController")
"""The reasons that keep the replicas as found, deciding nothing else."""


def scale_up_step(current: int) -> int:
    """The most replicas one decision adds: double, or +4 when that is more."""
    return max(current, MIN_STEP_UP)


@dataclass(frozen=True)
class PoolLimits:
    """The WorkerPool's spec, as far as the decision is concerned."""

    min_replicas: int
    max_replicas: int
    target_age_seconds: float
    stabilization_seconds: float
    jobs_per_replica: int = 1
    """Jobs one replica runs at once (spec.jobsPerReplica, else the target's --concurrency)."""


@dataclass(frozen=True)
class QueueSample:
    """What the database said at this poll, for the pool's job types."""

    oldest_ready_age_seconds: float
    ready_jobs: int
    running_jobs: int = 0
    """Running jobs of the pool's types, whoever holds them."""
    held_jobs: int = 0
    """Running jobs held by the live workers of the target's pods (the worker registry)."""
    busy_replicas: int = 0
    """Live workers of the target's pods that hold at least one running job."""
    slots_per_replica: int = 1
    """Jobs one replica runs at once: the largest concurrency its workers registered."""

    @property
    def floor(self) -> int:
        """The fewest replicas that stop no running job."""
        needed = math.ceil(self.held_jobs / max(self.slots_per_replica, 1))
        return max(needed, self.busy_replicas)

    def cap(self, jobs_per_replica: int) -> int:
        """The most replicas the ready and running jobs could keep busy."""
        return math.ceil((self.ready_jobs + self.running_jobs) / max(jobs_per_replica, 1))


@dataclass(frozen=True)
class ScaleMemory:
    """What a decision remembers for the next poll of the same pool."""

    window_start: float | None = None
    """Since when recommendations have been observed (reset by a manual change)."""
    recommendations: tuple[tuple[float, int], ...] = field(default_factory=tuple)
    """(time, recommended replicas) of the polls inside the stabilization window."""
    last_desired: int | None = None
    """The replicas decided last time: anything else found means a manual change."""


@dataclass(frozen=True)
class Decision:
    """The replicas to set, why, and what to remember."""

    desired: int
    reason: str
    message: str
    memory: ScaleMemory


def recommend(limits: PoolLimits, current: int, sample: QueueSample) -> tuple[int, str]:
    """The replicas this one sample asks for, clamped and capped, with the reason's name."""
    if sample.ready_jobs <= 0 and sample.running_jobs <= 0:
        return _clamp(limits, limits.min_replicas), "QueueEmpty"
    if sample.ready_jobs <= 0:
        return _clamp(limits, max(limits.min_replicas, 1, sample.floor)), "JobsRunning"
    base = max(current, 1)
    ratio = sample.oldest_ready_age_seconds / limits.target_age_seconds
    if ratio > 1 + TOLERANCE:
        # Capped before rounding: a target the CRD admits (any number above 0) can
        # make the ratio infinite, and an infinity has no ceiling.
        wanted = math.ceil(min(base * ratio, current + scale_up_step(current)))
        reason = "QueueTooOld"
    elif ratio >= 1 - TOLERANCE:
        wanted, reason = base, "QueueOnTarget"
    else:
        wanted, reason = max(1, math.ceil(base * ratio)), "QueueYoung"
    if current == 0:
        reason = "ScaleFromZero"
    cap = sample.cap(limits.jobs_per_replica)
    if wanted > cap:
        wanted, reason = cap, "CappedByJobs"
    return max(1, _clamp(limits, wanted)), reason


def decide(
    limits: PoolLimits,
    current: int,
    sample: QueueSample,
    memory: ScaleMemory,
    now: float,
    hold: str | None = None,
) -> Decision:
    """Decide the replicas for this poll (see the module's docstring for the policy).

    `hold` (one of HOLDS) keeps `current` and forgets the window: when the hold
    ends, the pool starts observing afresh from the replicas it finds."""
    if hold is not None:
        message = describe(limits, current, sample, current, hold)
        return Decision(current, hold, message, ScaleMemory(last_desired=current))
    if memory.last_desired is not None and current != memory.last_desired:
        memory = ScaleMemory()  # a manual change: start observing afresh
    wanted, reason = recommend(limits, current, sample)
    start = now if memory.window_start is None else memory.window_start
    horizon = now - limits.stabilization_seconds
    window = (*((t, r) for t, r in memory.recommendations if t > horizon), (now, wanted))
    if wanted >= current:
        desired = wanted
    elif now - start < limits.stabilization_seconds:
        desired, reason = current, "Stabilizing"
    else:
        desired = min(current, max(r for _, r in window))
        reason = reason if desired < current else "Stabilizing"
    if desired < sample.floor:
        desired, reason = sample.floor, "JobsRunning"
    clamped = _clamp(limits, desired)
    if clamped != desired:
        desired, reason = clamped, "OutOfBounds"
    message = describe(limits, current, sample, desired, reason)
    return Decision(desired, reason, message, ScaleMemory(start, window, desired))


def describe(
    limits: PoolLimits, current: int, sample: QueueSample, desired: int, reason: str
) -> str:
    """One line with the numbers behind a decision, for the Event and the log."""
    return (
        f"{reason}: {current} -> {desired} replicas; {sample.ready_jobs} ready jobs, "
        f"oldest waiting {sample.oldest_ready_age_seconds:.1f}s "
        f"(target {limits.target_age_seconds:g}s); {sample.running_jobs} running, "
        f"{sample.held_jobs} on {sample.busy_replicas} busy replicas of "
        f"{sample.slots_per_replica} slots: at least {sample.floor}; "
        f"at most {sample.cap(limits.jobs_per_replica)} at {limits.jobs_per_replica} "
        f"jobs per replica, +{scale_up_step(current)} per decision; bounds "
        f"[{limits.min_replicas}, {limits.max_replicas}], "
        f"stabilization {limits.stabilization_seconds:g}s"
    )


def _clamp(limits: PoolLimits, replicas: int) -> int:
    return max(limits.min_replicas, min(limits.max_replicas, replicas))
