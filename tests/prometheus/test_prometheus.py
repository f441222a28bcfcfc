"""Every dashboard query and alert expression, evaluated by a real Prometheus,
against the database's truth.

Debian's Prometheus scrapes, every second, a real worker (in this process, with
handlers whose outcomes and durations are known in advance) and a real
`rota exporter` process, under traffic: jobs that succeed, retry then succeed,
die after three attempts, fail permanently; a worker process killed while it
holds leases (the reaper gives them back, and they die at their last attempt);
a schedule whose slots were missed; a paused type; a type nobody handles. When
the database has reached its final state and both targets were scraped after
it, each panel and each alert expression is asked through /api/v1/query and
compared with what SQL says. The alert windows (15 min, 1 h) are shortened to
the test's own length and their thresholds lowered to 0, so every expression
returns the values it compares.

With ROTA_DASHBOARD_DATA=path, the panels' range queries over the run are also
written to `path` for scripts/render_dashboard.py (docs/dashboard.png).

Prometheus comes with Debian's prometheus package, which `make install` installs
when it may (root with apt-get); without it this test is skipped.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg.rows import dict_row

import rota
from rota import control, workers
from rota.handlers import Handler
from rota.metrics import DURATION_BUCKETS
from rota.settings import BackoffSettings
from rota_worker import outcomes as worker_outcomes
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import WorkerProcess, env_for, free_port, wait_for

ROOT = Path(__file__).parents[2]
ALERTS = ROOT / "charts" / "rota" / "files" / "alerts.yaml"
DASHBOARD = ROOT / "charts" / "rota" / "files" / "dashboard.json"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian package prometheus; make install)"
)

SLEEP_MS = {"shop.email": 55, "shop.flaky": 105, "shop.poison": 205, "shop.bad": 32}
"""What each handler sleeps: chosen inside a duration bucket, far from its upper bound.
A loaded machine stretches an attempt past it, so the durations are compared with
those the worker measured."""
WORKER_TYPES = sorted(SLEEP_MS)


# -- the worker's handlers: outcomes and durations known in advance ---------------------


async def _email(job: rota.Job) -> None:
    await asyncio.sleep(job.payload["ms"] / 1000)


async def _flaky(job: rota.Job) -> None:
    await asyncio.sleep(job.payload["ms"] / 1000)
    if job.attempts < 2:
        raise RuntimeError("flaky: fails its first attempt")


async def _poison(job: rota.Job) -> None:
    await asyncio.sleep(job.payload["ms"] / 1000)
    raise RuntimeError("poison: fails every attempt")


async def _bad(job: rota.Job) -> None:
    await asyncio.sleep(job.payload["ms"] / 1000)
    raise rota.Permanent("bad: can never succeed")


HANDLERS = {
    name: Handler(name, func, is_async=True, wants_context=False)
    for name, func in [
        ("shop.email", _email),
        ("shop.flaky", _flaky),
        ("shop.poison", _poison),
        ("shop.bad", _bad),
    ]
}


# -- Prometheus -------------------------------------------------------------------------


class Prometheus:
    """A Prometheus server of the test's own: 1 s scrapes and rule evaluations."""

    def __init__(self, workdir: Path, targets: list[int]) -> None:
        assert PROMETHEUS is not None
        self.port = free_port()
        config = {
            "global": {
                "scrape_interval": "1s",
                "evaluation_interval": "1s",
                "scrape_timeout": "900ms",
            },
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    "job_name": "rota",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{port}" for port in targets],
                            "labels": {"namespace": "test"},
                        }
                    ],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._ready, timeout=60, what="Prometheus to start")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            assert self.proc.poll() is None, "Prometheus exited"
            return False

    def api(self, path: str, **params: Any) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
        data = self.api("query", query=expr, time=f"{at:.3f}")
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def scraped_after(prom: Prometheus, metric: str, instant: float) -> Callable[[], bool]:
    """True once `metric` has a sample scraped after `instant`."""

    def check() -> bool:
        got = prom.query(f"timestamp({metric})", time.time())
        return bool(got) and min(value for _, value in got) > instant

    return check


def settled(prom: Prometheus, db_url: str) -> Callable[[], float | None]:
    """A time to ask Prometheus at whose last scrape of the exporter began more than a
    second after the newest job was created (its commit read by that scrape), with
    no job created since: the queue's counts then hold for that time. The schedule
    keeps adding jobs, one a minute, and a scrape lags more the more the machine is
    loaded."""
    newest = "SELECT extract(epoch FROM max(created_at))::float8 AS t FROM rota.job"

    def check() -> float | None:
        before = rows(db_url, newest)[0]["t"]
        now = time.time()
        got = prom.query("timestamp(rota_jobs)", now)
        if not got or min(value for _, value in got) <= before + 1.0:
            return None
        return now if rows(db_url, newest)[0]["t"] == before else None

    return check


# -- the database's truth ---------------------------------------------------------------


def rows(db_url: str, query: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:  # type: ignore[arg-type]
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def exact_quantile(values: list[Any], q: float) -> Any:
    """The smallest value v with at least q of the values <= v."""
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


def bucket_of(seconds: float) -> tuple[float, float]:
    """The duration bucket (lower, upper] that holds `seconds`."""
    lower = 0.0
    for upper in DURATION_BUCKETS:
        if seconds <= upper:
            return lower, upper
        lower = upper
    return lower, math.inf


# -- the run ----------------------------------------------------------------------------


@pytest.fixture
def exporter_port() -> int:
    return free_port()


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[float]]:
    """The duration of each attempt as the in-process worker counts it, by type."""
    seen: dict[str, list[float]] = {}
    count = worker_outcomes.record_outcomes

    def record(runs: Iterable[tuple[str, Any, float, int]]) -> None:
        batch = list(runs)
        for job_type, _, seconds, _ in batch:
            seen.setdefault(job_type, []).append(seconds)
        count(batch)

    monkeypatch.setattr(worker_outcomes, "record_outcomes", record)
    return seen


@pytest.fixture
def run(
    db_url: str, tmp_path: Path, exporter_port: int, measured: dict[str, list[float]]
) -> Iterator[dict[str, Any]]:
    """Prometheus, the exporter and a worker, and everything the test asks them."""
    worker_port = free_port()
    prom = Prometheus(tmp_path, [worker_port, exporter_port])
    exporter: subprocess.Popen[bytes] | None = None
    worker: Worker | None = None
    thread: threading.Thread | None = None
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE runs (job_id bigint, attempt int, pid int, note text)")
            conn.execute(
                "INSERT INTO rota.schedule (name, job_type, cron, next_run_at)"
                " VALUES ('test/minutely', 'shop.report', '* * * * *',"
                " date_trunc('minute', now()) - interval '5 minutes')"
            )
        rota.pause(db_url, ["shop.paused"])
        for _ in range(3):
            rota.enqueue(db_url, "shop.paused")
        for _ in range(2):
            rota.enqueue(db_url, "shop.nobody")
        for _ in range(3):
            rota.enqueue(db_url, "hang.sync", max_attempts=1)
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rota",
                "exporter",
                "--port",
                str(exporter_port),
                "--cache",
                "0",
            ],
            env=env_for(db_url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        start = time.time()
        wait_for(scraped_after(prom, 'rota_jobs{type="hang.sync"}', start), 60, "a first scrape")
        # A scrape of every counter of the database from before any traffic: the alerts'
        # offsets land on it exactly (a later scrape may time out on a loaded machine,
        # and a failed scrape leaves no series until the next).
        (_, before), *_ = prom.query('timestamp(rota_jobs{type="hang.sync"})', time.time())

        # A worker killed while it holds three leases: the reaper gives them back.
        victim = WorkerProcess(
            db_url, "--types", "hang.sync", "--lease", "2", "--no-scheduler", "--no-reaper"
        )
        running = "SELECT count(*) AS n FROM rota.job WHERE status = 'running'"
        wait_for(lambda: rows(db_url, running)[0]["n"] == 3, 60, "the victim's three jobs")
        victim.signal(signal.SIGKILL)
        victim.wait()

        settings = WorkerSettings(
            concurrency=10,
            worker_id="w-prometheus",
            metrics_port=worker_port,
            poll_interval_seconds=0.2,
            backoff=BackoffSettings(base_seconds=0.3, cap_seconds=1.0, jitter=0.0),
        )
        worker = Worker(db_url, settings, handlers=HANDLERS)
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        wait_for(scraped_after(prom, "rota_worker_slots", time.time()), 60, "the worker's scrape")

        # Traffic in three waves, so the panels have a shape over time.
        def enqueue(job_type: str, count: int) -> None:
            for _ in range(count):
                rota.enqueue(db_url, job_type, {"ms": SLEEP_MS[job_type]}, max_attempts=3)

        enqueue("shop.email", 10)
        enqueue("shop.flaky", 12)
        enqueue("shop.poison", 6)
        time.sleep(6)  # spacing the waves out for the picture; nothing waits on it
        enqueue("shop.email", 10)
        enqueue("shop.bad", 2)
        time.sleep(6)
        enqueue("shop.email", 10)

        ended = (
            "SELECT count(*) AS n FROM rota.job WHERE type LIKE 'shop.%%'"
            " AND type NOT IN ('shop.paused', 'shop.nobody', 'shop.report')"
            " AND status IN ('done', 'failed', 'dead')"
        )
        wait_for(lambda: rows(db_url, ended)[0]["n"] == 50, 120, "every job to end")
        dead = "SELECT count(*) AS n FROM rota.job WHERE type = 'hang.sync' AND status = 'dead'"
        wait_for(lambda: rows(db_url, dead)[0]["n"] == 3, 120, "the reaper to bury the hung jobs")
        missed = "SELECT missed_slots AS n FROM rota.schedule WHERE name = 'test/minutely'"
        wait_for(lambda: rows(db_url, missed)[0]["n"] > 0, 60, "the scheduler's missed slots")
        final = time.time()
        for metric in ("rota_workers", "rota_worker_slots"):
            wait_for(scraped_after(prom, metric, final + 1.0), 60, f"{metric} after the end")
        at = wait_for(settled(prom, db_url), 60, "a scrape after the newest job")
        yield {
            "prom": prom,
            "db_url": db_url,
            "start": start,
            "before": before,
            "at": at,
            "stop_exporter": exporter,
            "exporter_port": exporter_port,
            "measured": measured,
        }
    finally:
        if worker is not None and thread is not None:
            worker.stop()
            thread.join(timeout=60)
        if exporter is not None and exporter.poll() is None:
            exporter.terminate()
            exporter.wait(timeout=30)
        prom.stop()


def dashboard_targets() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    document = json.loads(DASHBOARD.read_text())
    return [(panel, target) for panel in document["panels"] for target in panel["targets"]]


def fill(expr: str, window: str, job_type: str = ".*") -> str:
    """A panel's query as Grafana would send it for installation test/rota."""
    for name, value in [
        ("$namespace", "test"),
        ("$job", "rota"),
        ("$type", job_type),
        ("$__rate_interval", window),
        ("$target_age", "60"),
    ]:
        expr = expr.replace(name, value)
    return expr


def test_every_panel_and_alert_matches_the_database(run: dict[str, Any]) -> None:
    prom: Prometheus = run["prom"]
    db_url: str = run["db_url"]
    at: float = run["at"]
    window = f"{math.ceil(at - run['start']) + 30}s"  # the whole run: quantiles of every job
    since = f"{round((round(at, 3) - run['before']) * 1000)}ms"  # the scrape before any traffic

    def ask(expr: str) -> list[tuple[dict[str, str], float]]:
        return prom.query(expr, at)

    def by(results: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
        return {metric.get(label, ""): value for metric, value in results}

    panels: dict[str, list[str]] = {}
    for panel, target in dashboard_targets():
        panels.setdefault(panel["title"], []).append(fill(target["expr"], window))

    # -- the truth, from SQL: the jobs that existed at `at` (the schedule adds more)
    counts = {
        (r["type"], r["status"]): r["n"]
        for r in rows(
            db_url,
            "SELECT type, status, count(*) AS n FROM rota.job"
            " WHERE created_at <= to_timestamp(%s) GROUP BY 1, 2",
            at,
        )
    }
    mine = rows(
        db_url,
        "SELECT type, status, attempts FROM rota.job WHERE type = ANY(%s)",
        WORKER_TYPES,
    )
    ages = {
        r["type"]: r["age"]
        for r in rows(
            db_url,
            "SELECT type, extract(epoch FROM to_timestamp(%s) - min(run_at))::float8 AS age"
            " FROM rota.job WHERE status = 'ready' AND run_at <= to_timestamp(%s) GROUP BY type",
            at,
            at,
        )
    }
    dead_total = sum(n for (_, status), n in counts.items() if status == "dead")
    expired = rows(db_url, "SELECT coalesce(sum(count), 0)::int AS n FROM rota.lease_expiration")
    missed = rows(db_url, "SELECT name, missed_slots FROM rota.schedule WHERE missed_slots > 0")
    paused = set(control.paused(db_url))

    # -- Oldest ready job age: every type, within the scrape's lag of the database
    age, target = panels["Oldest ready job age"]
    got = by(ask(age), "type")
    assert {t for t, v in got.items() if v > 0} == set(ages)
    for job_type, seconds in ages.items():
        assert abs(got[job_type] - seconds) < 5, (job_type, got[job_type], seconds)
    assert ask(target)[0][1] == 60

    # -- Throughput by outcome: the shares of the attempts the worker made
    (throughput,) = panels["Throughput by outcome"]
    rates = by(ask(throughput), "outcome")
    truth = {"done": 0, "retry": 0, "failed": 0, "dead": 0}
    for row in mine:
        truth[row["status"]] += 1
        truth["retry"] += row["attempts"] - 1
    total = sum(truth.values())
    assert total == 50 + 12 + 12  # 50 jobs; flaky retried once, poison twice
    for outcome, n in truth.items():
        assert rates[outcome] / sum(rates.values()) == pytest.approx(n / total), outcome
    assert {o for o, v in rates.items() if v > 0} == set(truth)

    # -- Handler duration p50 / p95: inside the bucket that holds the true quantile of
    # the durations the worker measured (a loaded machine stretches them)
    p50, p95 = panels["Handler duration p50 / p95"]
    measured: dict[str, list[float]] = run["measured"]
    assert set(measured) == set(SLEEP_MS)
    for q, expr in ((0.5, p50), (0.95, p95)):
        got = by(ask(expr), "type")
        for job_type, ms in SLEEP_MS.items():
            true = exact_quantile(measured[job_type], q)
            assert true >= ms / 1000, (job_type, true, ms)
            lower, upper = bucket_of(true)
            assert lower < got[job_type] <= upper, (expr, job_type, got[job_type], true)

    # -- Attempts: exact whole-number quantiles of the attempts column, and the mean
    a50, a95, mean = panels["Attempts per ended job p50 / p95"]
    attempts = [r["attempts"] for r in mine]
    assert ask(a50)[0][1] == exact_quantile(attempts, 0.5) == 1
    assert ask(a95)[0][1] == exact_quantile(attempts, 0.95) == 3
    assert ask(mean)[0][1] == pytest.approx(sum(attempts) / len(attempts))

    # -- Jobs by status and running
    status_expr, running_expr = panels["Jobs by status"]
    got = by(ask(status_expr), "status")
    for status in ("ready", "failed", "dead"):
        assert got[status] == sum(n for (_, s), n in counts.items() if s == status), status
    assert got.get("cancelled", 0) == 0
    assert ask(running_expr)[0][1] == 0

    # -- Dead letters: the list, per type, and the deaths of the window from the counter
    all_dead, per_type, died = panels["Dead-letter jobs"]
    assert ask(all_dead)[0][1] == dead_total == 9
    assert by(ask(per_type), "type") == {
        t: float(n) for (t, s), n in counts.items() if s == "dead"
    } | {t: 0.0 for (t, _) in counts if (t, "dead") not in counts}
    assert {t: v for t, v in by(ask(died), "type").items() if v} == {
        "shop.poison": 6.0,
        "hang.sync": 3.0,
    }

    # -- Live workers: the killed worker's row is still there, it is not counted
    alive, scraped, slots, running = panels["Live workers"]
    assert rows(db_url, "SELECT count(*) AS n FROM rota.worker")[0]["n"] == 2
    assert ask(alive)[0][1] == workers.live_count(db_url) == 1
    assert (ask(scraped)[0][1], ask(slots)[0][1], ask(running)[0][1]) == (1, 10, 0)

    # -- WorkerPools: no operator in this installation, so no series
    (pools,) = panels["Workers: desired vs current replicas"]
    assert ask(pools) == []

    # -- Paused job types
    (paused_expr,) = panels["Paused job types"]
    got = by(ask(paused_expr), "type")
    assert {t for t, v in got.items() if v == 1} == paused == {"shop.paused"}

    # -- Lease expirations and missed slots of the past hour
    (leases,) = panels["Lease expirations per hour"]
    assert ask(leases)[0][1] == expired[0]["n"] == 3
    (slots_missed,) = panels["Missed schedule slots per hour"]
    got = {name: v for name, v in by(ask(slots_missed), "schedule").items() if v}
    assert got == {r["name"]: r["missed_slots"] for r in missed}

    # -- $type filters every typed panel
    for panel, target in dashboard_targets():
        if 'type=~"$type' in target["expr"]:
            for metric, _ in ask(fill(target["expr"], window, "shop.email")):
                assert metric.get("type", "shop.email") == "shop.email", panel["title"]

    # -- every alert expression, windows shortened to the run and thresholds at 0
    rules = {
        r["alert"]: r["expr"]
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
    }

    def alert(name: str) -> list[tuple[dict[str, str], float]]:
        expr = re.sub(r"offset (15m|1h)", f"offset {since}", rules[name])
        return ask(re.sub(r"> (?:10|120|300)\b", "> 0", expr))

    installation = {"namespace": "test", "job": "rota"}
    assert alert("RotaDeadJobsPresent") == [(installation, dead_total)]
    assert alert("RotaDeadJobsGrowing") == [(installation, dead_total)]  # all died in the run
    assert by(alert("RotaQueueAgeHigh"), "type") == pytest.approx(ages, abs=5)
    assert alert("RotaLeaseExpirationsHigh") == [(installation, 3)]
    assert by(alert("RotaScheduleSlotsMissed"), "schedule") == {
        r["name"]: r["missed_slots"] for r in missed
    }
    due_unpaused = {t for t in ages if t not in paused}
    assert {m["type"] for m, _ in alert("RotaWorkersAbsent")} == due_unpaused
    assert alert("RotaQueueExporterAbsent") == []
    assert alert("RotaTargetDown") == []
    health = [
        r["health"]
        for g in prom.api("rules")["groups"]
        for r in g["rules"]
        if r["type"] == "alerting"
    ]
    assert health == ["ok"] * len(rules)

    # -- the pages pass `promtool check metrics`
    if PROMTOOL is not None:
        for target in prom.api("targets")["activeTargets"]:
            with urllib.request.urlopen(target["scrapeUrl"], timeout=10) as page:
                text = page.read()
            assert b"_created" not in text
            lint = subprocess.run(
                [PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60
            )
            assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr

    if os.environ.get("ROTA_DASHBOARD_DATA"):
        save_ranges(prom, run, Path(os.environ["ROTA_DASHBOARD_DATA"]))

    # -- the exporter goes away: the absent() rule fires for the installation
    exporter: subprocess.Popen[bytes] = run["stop_exporter"]
    exporter.terminate()
    exporter.wait(timeout=30)

    def exporter_absent() -> list[dict[str, str]]:
        return sorted(
            (m for m, _ in prom.query(rules["RotaQueueExporterAbsent"], time.time())),
            key=len,
        )

    assert wait_for(exporter_absent, 60, "the exporter's absence") == [{}, installation]

    # ... and its target answers no scrape (up == 0): RotaTargetDown names it
    def targets_down() -> list[dict[str, str]]:
        return [m for m, _ in prom.query(rules["RotaTargetDown"], time.time())]

    down = wait_for(targets_down, 60, "the exporter's target to be down")
    exporter_target = {**installation, "instance": f"127.0.0.1:{run['exporter_port']}"}
    assert down == [{"__name__": "up", **exporter_target}]


def save_ranges(prom: Prometheus, run: dict[str, Any], path: Path) -> None:
    """Every panel's series over the run, as Grafana would draw them (for the docs)."""
    document = json.loads(DASHBOARD.read_text())
    out = {"start": run["start"], "end": run["at"], "panels": []}
    for panel in document["panels"]:
        series = []
        for target in panel["targets"]:
            data = prom.api(
                "query_range",
                query=fill(target["expr"], "5s"),
                start=f"{run['start']:.3f}",
                end=f"{run['at']:.3f}",
                step="1",
            )
            for result in data["result"]:
                legend = re.sub(
                    r"\{\{\s*(\w+)\s*\}\}",
                    lambda m, labels=result["metric"]: labels.get(m.group(1), ""),
                    target["legendFormat"],
                )
                points = [(float(t), float(v)) for t, v in result["values"]]
                series.append({"legend": legend, "points": points})
        out["panels"].append(
            {
                "title": panel["title"],
                "unit": panel["fieldConfig"]["defaults"].get("unit", "short"),
                "gridPos": panel["gridPos"],
                "series": series,
            }
        )
    path.write_text(json.dumps(out))
