"""The worker's in-process measures, counted a batch at a time."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from rota.jobs import Outcome
from rota.metrics import ATTEMPT_BUCKETS, DURATION_BUCKETS, RunCounter


def series(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    """Samples of family `name` by (sample name, label values...), `_created` left out."""
    return {
        (sample.name, *sorted(sample.labels.items())): sample.value  # type: ignore[misc]
        for family in registry.collect()
        if family.name == name
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_a_batch_counts_as_prometheus_histograms_would_one_by_one() -> None:
    # Every bound itself, values between and past the last one, and a negative duration.
    durations = [*DURATION_BUCKETS, 0.0, 0.007, 4000.0, -1.0, 0.05, 0.050001]
    attempts = [*ATTEMPT_BUCKETS, 6, 200]
    ours = RunCounter()
    ours.record(("t", Outcome.RETRY, d, 1) for d in durations)
    ours.record([("t", Outcome.DONE, 0.1, n) for n in attempts])
    mine = CollectorRegistry()
    mine.register(ours)

    expected = CollectorRegistry()
    duration = Histogram(
        "rota_job_duration_seconds", "d", ["type"], buckets=DURATION_BUCKETS, registry=expected
    )
    tries = Histogram("rota_job_attempts", "a", buckets=ATTEMPT_BUCKETS, registry=expected)
    for d in [*durations, *[0.1] * len(attempts)]:
        duration.labels(type="t").observe(max(0.0, d))
    for n in attempts:
        tries.observe(n)

    for name in ("rota_job_duration_seconds", "rota_job_attempts"):
        got, want = series(mine, name), series(expected, name)
        assert got.keys() == want.keys()
        assert got == pytest.approx(want)
    text = generate_latest(mine).decode()
    assert 'rota_jobs_finished_total{outcome="retry",type="t"} 24.0' in text
    assert 'rota_jobs_finished_total{outcome="done",type="t"} 14.0' in text


def test_a_batch_with_an_unknown_outcome_counts_nothing() -> None:
    counter = RunCounter()
    with pytest.raises(ValueError, match="unknown outcome"):
        counter.record([("t", Outcome.DONE, 0.1, 1), ("t", "exploded", 0.1, 1)])  # type: ignore[list-item]
    registry = CollectorRegistry()
    registry.register(counter)
    assert "rota_jobs_finished_total{" not in generate_latest(registry).decode()
