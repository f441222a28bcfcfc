"""Draw docs/dashboard.png: the Grafana dashboard's panels from a real run.

Starts an embedded PostgreSQL, runs real workers in this process against a
load with a burst, a flaky and a poison job type, a "crashed" worker whose
leases expire, and a schedule whose schedulers were down for a few minutes.
The replicas follow the operator's own scaling decision (rota_operator.scaling)
from the measured queue age, as the operator would set them on a Deployment;
here a replica is a worker thread. Every second the metrics Rota serves are
scraped and parsed, and each panel is computed from the samples the way its
PromQL query would be (rates, increases, histogram quantiles).

Needs matplotlib (not a dependency of Rota):
    .venv/bin/pip install matplotlib && .venv/bin/python scripts/render_dashboard.py
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import rota
import rota.archive  # registers the handler of the built-in rota.archive jobs
from rota import schedules
from rota.claim import claim
from rota.db import connect
from rota.inspect import queue_age
from rota.metrics import build_registry
from rota.testing import EmbeddedPostgres
from rota_operator.scaling import PoolLimits, QueueSample, ScaleMemory, decide
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker

OUT = Path(__file__).parents[1] / "docs" / "dashboard.png"
SECONDS = 150
TARGET_AGE = 10.0
LIMITS = PoolLimits(
    min_replicas=0, max_replicas=6, target_age_seconds=TARGET_AGE, stabilization_seconds=30
)
Sample = dict[tuple[str, frozenset[tuple[str, str]]], float]


@rota.handler("shop.email")
async def email(job: rota.Job) -> None:
    await asyncio.sleep(random.uniform(0.02, 0.3))


@rota.handler("shop.resize")
def resize(job: rota.Job) -> None:
    time.sleep(random.uniform(0.3, 1.2))


@rota.handler("shop.flaky")
def flaky(job: rota.Job) -> None:
    if job.attempts < 3:
        raise ConnectionResetError("upstream hung up")


@rota.handler("shop.poison")
def poison(job: rota.Job) -> None:
    raise ValueError("cannot parse payload")


class Pool:
    """Worker threads standing in for a Deployment's pods."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.running: list[tuple[Worker, threading.Thread]] = []

    def scale(self, replicas: int) -> None:
        while len(self.running) < replicas:
            settings = WorkerSettings(
                concurrency=3, poll_interval_seconds=0.5, grace_period_seconds=3, lease_seconds=6
            )
            worker = Worker(self.dsn, settings)
            thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
            thread.start()
            self.running.append((worker, thread))
        while len(self.running) > replicas:
            worker, thread = self.running.pop()
            worker.stop()
            thread.join(timeout=30)


def load(dsn: str, second: int) -> None:
    """The traffic of one second of the run."""
    jobs = [rota.NewJob("shop.email", {"n": i}) for i in range(random.randint(2, 6))]
    if 20 <= second < 50:
        jobs += [rota.NewJob("shop.resize", {"n": i}) for i in range(8)]
    if second % 10 == 0:
        jobs.append(rota.NewJob("shop.flaky", {"n": second}, max_attempts=5))
    if second in (40, 70, 75, 100):
        jobs.append(rota.NewJob("shop.poison", {"n": second}, max_attempts=2))
    rota.enqueue_many(dsn, jobs)


def incidents(dsn: str, second: int) -> None:
    if second == 60:  # a worker claims jobs, then dies: its leases expire
        with connect(dsn) as conn, conn.transaction():  # claimed before any worker sees them
            rota.enqueue_many(conn, [rota.NewJob("shop.email", {"crash": i}) for i in range(6)])
            claim(conn, "crashed-pod", 6, 2.0, types=["shop.email"])
    if second == 90:  # every scheduler was down for the last five minutes
        spec = schedules.ScheduleSpec("shop/every-minute", "shop.email", "* * * * *")
        schedules.upsert(dsn, spec, now=datetime.now(UTC) - timedelta(minutes=5))


def scrape(registry: Any) -> Sample:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def run() -> tuple[list[Sample], list[tuple[int, int]]]:
    """Run the scenario; return one scrape and (desired, current) replicas per second."""
    logging.getLogger("rota").setLevel(logging.CRITICAL)
    with EmbeddedPostgres() as pg:
        dsn = pg.url()
        rota.migrate(dsn)
        registry = build_registry(dsn, cache_seconds=0)
        pool, memory, desired = Pool(dsn), ScaleMemory(), 0
        scrapes, replicas = [], []
        started = time.monotonic()
        try:
            for second in range(SECONDS):
                load(dsn, second)
                incidents(dsn, second)
                if second % 2 == 0:  # the operator's poll
                    age = queue_age(dsn, ["shop.email", "shop.resize", "shop.flaky"])
                    sample = QueueSample(age.oldest_ready_age_seconds, age.ready_jobs)
                    decision = decide(LIMITS, len(pool.running), sample, memory, second)
                    memory, desired = decision.memory, decision.desired
                replicas.append((desired, len(pool.running)))
                scrapes.append(scrape(registry))
                pool.scale(desired)  # the Deployment follows, a scrape later
                time.sleep(max(0.0, started + second + 1 - time.monotonic()))
        finally:
            pool.scale(0)
    return scrapes, replicas


# -- the panels, computed as their PromQL would be -------------------------------------


def series(
    scrapes: list[Sample], name: str, **match: str
) -> dict[frozenset[tuple[str, str]], list[float]]:
    found: dict[frozenset[tuple[str, str]], list[float]] = defaultdict(lambda: [0.0] * len(scrapes))
    for i, sample in enumerate(scrapes):
        for (sample_name, labels), value in sample.items():
            if sample_name == name and all(dict(labels).get(k) == v for k, v in match.items()):
                found[labels][i] = value
    return found


def summed(
    scrapes: list[Sample], name: str, by: tuple[str, ...], **match: str
) -> dict[tuple[str, ...], list[float]]:
    out: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0] * len(scrapes))
    for labels, values in series(scrapes, name, **match).items():
        key = tuple(dict(labels).get(k, "") for k in by)
        out[key] = [a + b for a, b in zip(out[key], values, strict=True)]
    return out


def rate(values: list[float], window: int = 15) -> list[float]:
    return [
        (values[i] - values[max(0, i - window)]) / max(1, min(i, window))
        for i in range(len(values))
    ]


def quantile(q: float, buckets: dict[float, list[float]], i: int, window: int = 15) -> float:
    """histogram_quantile over the bucket increases of the last `window` seconds."""
    bounds = sorted(buckets)
    counts = [buckets[b][i] - buckets[b][max(0, i - window)] for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    rank, lower, below = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def histogram(scrapes: list[Sample], name: str, **match: str) -> dict[float, list[float]]:
    by_le = summed(scrapes, f"{name}_bucket", ("le",), **match)
    return {float(le): values for (le,), values in by_le.items()}


def draw(scrapes: list[Sample], replicas: list[tuple[int, int]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = list(range(len(scrapes)))
    plt.style.use("dark_background")
    fig, axes = plt.subplots(3, 3, figsize=(18, 12))
    fig.suptitle("Rota — dashboard panels from a real 150 s run (embedded PostgreSQL)", fontsize=15)

    def panel(ax: Any, title: str, unit: str = "") -> None:
        ax.set_title(title, loc="left", fontsize=11)
        ax.grid(alpha=0.2)
        ax.set_xlabel("seconds")
        if unit:
            ax.set_ylabel(unit)

    ax = axes[0][0]
    for (job_type,), values in sorted(
        summed(scrapes, "rota_oldest_ready_job_age_seconds", ("type",)).items()
    ):
        ax.plot(t, values, label=job_type)
    ax.axhline(TARGET_AGE, color="red", linestyle="--", label="target")
    panel(ax, "Oldest ready job age", "s")
    ax = axes[0][1]
    ax.step(t, [d for d, _ in replicas], where="post", label="desired")
    ax.step(t, [c for _, c in replicas], where="post", label="current", linestyle="--")
    panel(ax, "Workers: desired vs current replicas")
    ax = axes[0][2]
    for (outcome,), values in sorted(
        summed(scrapes, "rota_jobs_finished_total", ("outcome",)).items()
    ):
        ax.plot(t, rate(values), label=outcome)
    panel(ax, "Throughput by outcome", "jobs/s")
    ax = axes[1][0]
    for job_type in ("shop.email", "shop.resize"):
        buckets = histogram(scrapes, "rota_job_duration_seconds", type=job_type)
        for q in (0.5, 0.95):
            ax.plot(t, [quantile(q, buckets, i) for i in t], label=f"p{int(q * 100)} {job_type}")
    panel(ax, "Handler duration p50 / p95", "s")
    ax = axes[1][1]
    ax.plot(t, summed(scrapes, "rota_dead_jobs", ())[()], label="all types")
    panel(ax, "Dead-letter jobs")
    ax = axes[1][2]
    expired = summed(scrapes, "rota_lease_expirations_total", ())[()]
    ax.plot(t, [v - expired[0] for v in expired], label="expired leases, past hour")
    panel(ax, "Lease expirations per hour")
    ax = axes[2][0]
    for (schedule,), values in summed(
        scrapes, "rota_schedule_missed_slots_total", ("schedule",)
    ).items():
        ax.plot(t, values, label=schedule)
    panel(ax, "Missed schedule slots")
    ax = axes[2][1]
    for (status,), values in sorted(summed(scrapes, "rota_jobs", ("status",)).items()):
        if status in ("ready", "running", "failed", "dead"):
            ax.plot(t, values, label=status)
    panel(ax, "Jobs by status")
    ax = axes[2][2]
    attempts = histogram(scrapes, "rota_job_attempts")
    for q in (0.5, 0.95):
        ax.plot(t, [quantile(q, attempts, i, window=30) for i in t], label=f"p{int(q * 100)}")
    total = summed(scrapes, "rota_job_attempts_sum", ())[()]
    count = summed(scrapes, "rota_job_attempts_count", ())[()]
    ax.plot(
        t,
        [
            a / c if c else float("nan")
            for a, c in zip(rate(total, 30), rate(count, 30), strict=True)
        ],
        label="mean",
    )
    panel(ax, "Attempts per finished job")
    for ax in axes.flat:
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(OUT, dpi=80)


if __name__ == "__main__":
    draw(*run())
    print(f"wrote {OUT}")
