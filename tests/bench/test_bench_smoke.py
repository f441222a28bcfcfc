"""The benchmark runs end to end on Rota with tiny counts (no timings are checked).

The peers (pgqueuer, procrastinate) are bench extras, not test dependencies,
so only Rota's part runs here.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import Drain, Latency, percentile  # noqa: E402
from bench.run import measure, table  # noqa: E402

_names = itertools.count()


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile([7.0], 0.99) == 7


def test_rota_part_of_the_benchmark_runs_end_to_end(pg_server) -> None:
    created: list[str] = []

    def new_database(name: str) -> str:
        unique = f"bench_{os.getpid()}_{next(_names)}_{name}"
        created.append(unique)
        return pg_server.create(unique)

    try:
        results = measure(
            new_database,
            jobs=300,
            single_jobs=20,
            latency_jobs=5,
            gap=0.01,
            concurrency=20,
            peers=False,
            say=lambda _: None,
        )
    finally:
        for name in created:
            pg_server.drop(name)

    rota = results["rota"]
    assert rota["single"] > 0 and rota["batch"] > 0
    for processes in (1, 4):
        drain = rota[f"drain{processes}"]
        assert isinstance(drain, Drain)
        assert (drain.jobs, drain.processes) == (300, processes)
        assert drain.rate > 0
    assert isinstance(rota["latency"], Latency) and rota["latency"].jobs == 5
    printed = table(results)
    assert "| drain no-op jobs, 4 processes (jobs/s) |" in printed
    assert "| enqueue-to-start p50 (ms) |" in printed
