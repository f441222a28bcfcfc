"""The worker's in-process measures, counted a batch at a time."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from rota.errors import InvalidInput
from rota.jobs import Outcome
from rota.metrics import (
    ATTEMPT_BUCKETS,
    DURATION_BUCKETS,
    EXACT_ATTEMPTS,
    MetricsSettings,
    RunCounter,
    WorkerCollector,
)


def series(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    """Samples of family `name` by (sample name, label values...), `_created` left out."""
    return {
        (sample.name, *sorted(sample.labels.items())): sample.value  # type: ignore[misc]
        for family in registry.collect()
        if family.name == name
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def served(counter: RunCounter) -> str:
    registry = CollectorRegistry()
    registry.register(counter)
    return generate_latest(registry).decode()


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
    tries = Histogram(
        "rota_job_attempts", "a", ["type"], buckets=ATTEMPT_BUCKETS, registry=expected
    )
    for d in [*durations, *[0.1] * len(attempts)]:
        duration.labels(type="t").observe(max(0.0, d))
    for n in attempts:
        tries.labels(type="t").observe(n)

    for name in ("rota_job_duration_seconds", "rota_job_attempts"):
        got, want = series(mine, name), series(expected, name)
        assert got.keys() == want.keys()
        assert got == pytest.approx(want)
    text = generate_latest(mine).decode()
    assert f'rota_jobs_finished_total{{outcome="retry",type="t"}} {len(durations)}.0' in text
    assert f'rota_jobs_finished_total{{outcome="done",type="t"}} {len(attempts)}.0' in text


def test_a_histogram_never_goes_down_whatever_a_row_held() -> None:
    # A row written by hand with attempts below 0 (claimed: still below 0)
    # lowered rota_job_attempts_sum; a duration that is no number, its sum.
    counter = RunCounter()
    counter.record([("t", Outcome.DONE, 0.5, 3)])
    counter.record([("t", Outcome.DONE, float("nan"), -(2**31)), ("t", Outcome.DONE, 0.5, -4)])
    registry = CollectorRegistry()
    registry.register(counter)
    attempts = series(registry, "rota_job_attempts")
    durations = series(registry, "rota_job_duration_seconds")
    assert attempts[("rota_job_attempts_sum", ("type", "t"))] == 3
    assert attempts[("rota_job_attempts_count", ("type", "t"))] == 3
    assert durations[("rota_job_duration_seconds_sum", ("type", "t"))] == 1.0


def test_a_batch_with_an_unknown_outcome_counts_nothing() -> None:
    counter = RunCounter()
    with pytest.raises(ValueError, match="unknown outcome"):
        counter.record([("t", Outcome.DONE, 0.1, 1), ("t", "exploded", 0.1, 1)])  # type: ignore[list-item]
    registry = CollectorRegistry()
    registry.register(counter)
    assert "rota_jobs_finished_total{" not in generate_latest(registry).decode()


def test_no_created_series_are_served() -> None:
    counter = RunCounter()
    counter.record([("t", Outcome.DONE, 0.1, 1)])
    assert "_created" not in served(counter)


def test_attempt_buckets_are_every_whole_number_up_to_the_exact_limit() -> None:
    assert ATTEMPT_BUCKETS[:EXACT_ATTEMPTS] == tuple(range(1, EXACT_ATTEMPTS + 1))
    counter = RunCounter()
    counter.record([("email", Outcome.DONE, 0.1, 1), ("sms", Outcome.DEAD, 0.1, 3)])
    text = served(counter)
    assert 'rota_job_attempts_bucket{le="3.0",type="sms"} 1.0' in text
    assert 'rota_job_attempts_bucket{le="2.0",type="sms"} 0.0' in text
    assert 'rota_job_attempts_count{type="email"} 1.0' in text


def test_types_beyond_the_bound_fold_into_other() -> None:
    counter = RunCounter(MetricsSettings(max_types=2))
    counter.declare(["b", "a"])
    counter.record((t, Outcome.DONE, 0.1, 1) for t in ["c", "a", "d", "b", "c"])
    text = served(counter)
    assert 'rota_jobs_finished_total{outcome="done",type="other"} 3.0' in text
    assert 'rota_jobs_finished_total{outcome="done",type="a"} 1.0' in text
    assert 'type="c"' not in text and 'type="d"' not in text
    running = WorkerCollector(4, lambda: ["a", "c", "d"], counter)
    samples = {tuple(s.labels.values()): s.value for m in running.collect() for s in m.samples}
    assert samples == {(): 4, ("a",): 1, ("b",): 0, ("other",): 2}


def test_declared_types_start_at_zero() -> None:
    counter = RunCounter()
    counter.declare(["email"])
    text = served(counter)
    for outcome in Outcome:
        assert f'rota_jobs_finished_total{{outcome="{outcome}",type="email"}} 0.0' in text
    assert 'rota_job_duration_seconds_count{type="email"} 0.0' in text
    assert 'rota_job_attempts_bucket{le="+Inf",type="email"} 0.0' in text


def test_duration_buckets_and_the_type_bound_come_from_the_environment() -> None:
    settings = MetricsSettings.from_env(
        {"ROTA_METRICS_DURATION_BUCKETS": "0.1, 1,10", "ROTA_METRICS_MAX_TYPES": "7"}
    )
    assert settings == MetricsSettings(duration_buckets=(0.1, 1.0, 10.0), max_types=7)
    assert MetricsSettings.from_env({}) == MetricsSettings(DURATION_BUCKETS, 50)
    counter = RunCounter(settings)
    counter.record([("t", Outcome.DONE, 0.5, 1)])
    assert 'rota_job_duration_seconds_bucket{le="1.0",type="t"} 1.0' in served(counter)
    for bad in ({"ROTA_METRICS_DURATION_BUCKETS": "1,0.5"},
                {"ROTA_METRICS_DURATION_BUCKETS": "a"},
                {"ROTA_METRICS_DURATION_BUCKETS": "0,1"},
                {"ROTA_METRICS_MAX_TYPES": "0"},
                {"ROTA_METRICS_MAX_TYPES": "x"}):  # fmt: skip
        with pytest.raises(InvalidInput):
            MetricsSettings.from_env(bad)
