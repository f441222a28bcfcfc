"""The benchmark and the load soak run end to end with tiny counts.

Each runs as `make bench BENCH_ARGS=--quick` would, on its own durable
embedded PostgreSQL, and must produce every field; no timing is checked (speed
is measured by `make bench`, never asserted). The peers (pgqueuer, uvloop,
procrastinate) are bench extras, not test dependencies: the run beside them is
skipped when they are not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import percentile  # noqa: E402
from bench.peers import GRAPHILE_SETUPS, graphile_installed  # noqa: E402
from bench.run import GOALS, METRICS, PGQUEUER_SETUPS, churn_goal  # noqa: E402

ROTA_METRICS = {m.key for m in METRICS}
PEER_METRICS = ROTA_METRICS - {
    "drain1_done",
    "drain2_done",
    "done_ratio1",
    "done_ratio2",
    "drain1_reused",
    "drain2_reused",
    "done_like1",
    "done_like2",
    "drain1_limited",
    "drain2_limited",
    "limited_ratio1",
    "limited_ratio2",
    "history1",
    "history2",
}


def run_module(module: str, *args: str, timeout: float = 280) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_churn_goal_is_read_from_the_last_churn_run(tmp_path: Path) -> None:
    missing = churn_goal(str(tmp_path / "none.json"))
    assert missing["met"] is None and "run make bench-churn" in missing["goal"]
    found = tmp_path / "churn.json"
    found.write_text(
        json.dumps(
            {
                "goals": [
                    {"queue": "rota", "goal": "held p99 / pgqueuer's held p99", "value": 0.3},
                    {"queue": "rota", "goal": "held p99 / own steady p99", "value": 2.5,
                     "met": False},
                ]
            }
        )
    )  # fmt: skip
    row = churn_goal(str(found))
    assert (row["rota"], row["met"], row["target"]) == (2.5, False, "<= 2.0")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile([7.0], 0.99) == 7


def _check_rota(report: dict[str, Any]) -> None:
    rota = report["summary"]["rota"]
    assert set(rota) == ROTA_METRICS
    for entry in rota.values():
        assert entry["min"] <= entry["median"] <= entry["max"]
    for drain in report["results"]["rota"]["drain2"]:
        assert drain["processes"] == 2 and drain["jobs"] == report["plan"]["jobs"]
        assert drain["server_cpu_seconds"] is not None and drain["server_cpu_seconds"] >= 0
        assert drain["wal_bytes"] > 0 and drain["commits"] > 0
        assert drain["worker_cpu_seconds_per_1000_jobs"] > 0
    assert report["about"]["postgres"]
    round_trips = report["about"]["select_1_ms"]
    assert round_trips["back_to_back"] > 0 and round_trips["after_latency_gap"] > 0
    assert [g["metric"] for g in report["goals"]] == [g.metric for g in GOALS] + ["churn"]
    # Every drained job keeps its done row, with 1 and 2 processes.
    for key in ("drain1", "drain2"):
        for drain in report["results"]["rota"][key]:
            assert drain["history_rows"] == drain["jobs"]
            assert drain["enqueue_cpu_seconds"] is not None and drain["enqueue_wal_bytes"] > 0


@pytest.mark.parametrize("keys", ["constraint", "partial"])
def test_benchmark_of_rota_alone_produces_every_field(tmp_path: Path, keys: str) -> None:
    out = tmp_path / "latest.json"
    printed = run_module(
        "bench.run", "--quick", "--only-rota", "--key-index", keys, "--json", str(out)
    )
    report = json.loads(out.read_text())
    _check_rota(report)
    unique_by = {
        "constraint": "unique constraint job_idempotency_key_key",
        "partial": "partial unique index job_idempotency_key_idx",
    }[keys]
    assert f"keys unique by the {unique_by}" in printed
    for goal in report["goals"]:
        # The churn goal is read from the last `make bench-churn`, if any.
        assert goal["rota"] is not None or goal["metric"] == "churn", goal
    assert "| server CPU s per 1,000 jobs, 2 processes |" in printed
    assert "| goal | Rota | peer's best |" in printed


def test_benchmark_beside_pgqueuer_produces_every_ratio(tmp_path: Path) -> None:
    pytest.importorskip("pgqueuer")
    pytest.importorskip("uvloop")
    out = tmp_path / "latest.json"
    run_module("bench.run", "--quick", "--peers", "pgqueuer,pgqueuer-uvloop", "--json", str(out))
    report = json.loads(out.read_text())
    _check_rota(report)
    for setup in ("pgqueuer", "pgqueuer-uvloop"):
        assert set(report["summary"][setup]) == PEER_METRICS
    _check_ratios(report, PGQUEUER_SETUPS)


def _check_ratios(report: dict[str, Any], setups: tuple[str, ...]) -> None:
    """Every goal compared with one of `setups` has its ratio."""
    against = {g.label: g.against for g in GOALS if g.kind.startswith("ratio")}
    compared = [g for g in report["goals"] if against.get(g["goal"]) == setups]
    assert compared
    for goal in compared:
        assert goal["peer_best_setup"] in setups, goal
        # At --quick scale a peer's drain can cost the server less than one tick
        # of /proc's clock (10 ms): its CPU reads 0, and no ratio is defined.
        assert goal["ratio"] is not None or goal["peer_best"] == 0, goal


def test_benchmark_beside_graphile_worker_produces_every_ratio(tmp_path: Path) -> None:
    if not graphile_installed():
        pytest.skip("Graphile Worker needs node and npm: `make bench-graphile` installs it")
    out = tmp_path / "latest.json"
    printed = run_module(
        "bench.run", "--quick", "--peers", ",".join(GRAPHILE_SETUPS), "--json", str(out)
    )
    report = json.loads(out.read_text())
    _check_rota(report)
    for setup in GRAPHILE_SETUPS:
        assert set(report["summary"][setup]) == PEER_METRICS
        for drain in report["results"][setup]["drain2"]:
            assert drain["enqueue_cpu_seconds"] is not None and drain["history_rows"] is None
    _check_ratios(report, GRAPHILE_SETUPS)
    assert "a job deleted when done, no history" in printed


def test_load_soak_samples_every_field(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    printed = run_module(
        "bench.soak_load",
        *("--minutes", "0.15", "--sample-seconds", "3", "--rate", "50", "--json", str(out)),
    )
    result = json.loads(out.read_text())
    assert result["enqueued"] > 0 and len(result["samples"]) >= 2
    fields = {
        "table_bytes", "index_bytes", "total_bytes", "n_live_tup", "n_dead_tup",
        "last_autovacuum", "autovacuum_count", "ready", "running", "archived",
        "started", "p50_ms", "p99_ms", "max_ms", "elapsed_s", "server_cpu_s", "enqueued",
        "producer_lag_s",
    }  # fmt: skip
    for sample in result["samples"]:
        assert fields <= set(sample)
    assert set(result["summary"]) >= {"max_total_mb", "median_p99_ms", "archived"}
    assert "| min | table MB |" in printed


@pytest.mark.parametrize(
    ("module", "flag"), [("bench.soak_load", "--rate"), ("bench.churn", "--scale")]
)
def test_the_load_benchmarks_refuse_a_bad_rate_or_scale(module: str, flag: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, flag, "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "must be positive" in done.stderr


def test_plan_findings_show_every_hot_statement(tmp_path: Path) -> None:
    out = tmp_path / "findings.json"
    run_module(
        "bench.findings", "--skip-drains", "--done-rows", "0", "--latency-jobs", "3",
        "--rounds", "1", "--json", str(out),
    )  # fmt: skip
    report = json.loads(out.read_text())
    # The latency floor: the worker beside a bare listener, with and without a
    # flushed claim, each with the enqueue call's own time.
    assert set(report["latency"]) == {
        "worker", "raw listener", "raw listener, claim not flushed",
    }  # fmt: skip
    for runs in report["latency"].values():
        assert [r["jobs"] for r in runs] == [3]
        assert runs[0]["p50_ms"] > 0 and runs[0]["enqueue_p50_ms"] > 0
    assert "| raw listener |" in report["latency_table"]
    plans = report["plans"]
    for name in ("claim_jobs", "extend_leases", "write_outcomes"):
        entry = plans[name]
        assert "Update on job" in entry["generic_plan"]
        for mode in ("force_custom_plan", "force_generic_plan"):
            assert "Execution Time" in entry[mode]["plan"]
        assert len(entry["calls_ms"]) == 20 and len(entry["executed_plans"]) == 20
        assert set(entry["prepared"]) == {"generic_plans", "custom_plans"}


CHURN_FIGURES = {
    "jobs", "p50_ms", "p99_ms", "max_ms", "last_third_p99_ms", "claims", "claims_per_s",
    "claim_mean_ms", "claim_last_mean_ms", "backlog_max", "backlog_end", "total_mb_end",
    "total_mb_max", "table_mb_end", "index_mb_end", "other_mb_end", "dead_tuples_max",
    "dead_tuples_end", "autovacuums", "server_cpu_s_per_1000", "worker_cpu_s_per_1000",
}  # fmt: skip


def test_churn_benchmark_produces_every_figure_of_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    peers = ("pgqueuer", "uvloop")
    with_peer = all(_installed(name) for name in peers)
    printed = run_module(
        "bench.churn", "--quick", *([] if with_peer else ["--only-rota"]), "--json", str(out)
    )
    result = json.loads(out.read_text())
    # The load is derived from the drains it measured first.
    assert result["capacities"]["rota"] > 0 and result["rate"] > 0
    queues = [run["queue"] for run in result["runs"]]
    assert queues == (["rota", "pgqueuer-uvloop"] if with_peer else ["rota"])
    for run in result["runs"]:
        assert run["sent"] > 0 and run["samples"]
        assert set(run["phases"]) == {"steady", "held", "released"}
        for phase in run["phases"].values():
            assert set(phase) >= CHURN_FIGURES
            assert phase["jobs"] > 0 and phase["p99_ms"] >= phase["p50_ms"] > 0
            # The claim statement is found in pg_stat_statements for every queue.
            assert phase["claims"] > 0 and phase["claim_mean_ms"] > 0
            assert phase["total_mb_end"] > 0
        assert "back_within_1_5x_after_s" in run["phases"]["released"]
        # Where the server's time went in each phase, for the notes.
        assert set(run["top_statements"]) == {"steady", "held", "released"}
        assert all(run["top_statements"].values())
    assert [g["goal"] for g in result["goals"]][:1] == ["held p99 / own steady p99"]
    assert "| enqueue-to-start p99 (ms) | held |" in printed
    assert "| queue | goal | value | target | met |" in printed


def _installed(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def test_worker_variants_drain_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    printed = run_module(
        "bench.workers_ab",
        *("--variant", f"plain={sys.executable}"),
        *("--variant", f"lazy={sys.executable} --no-eager-tasks"),
        *("--rounds", "1", "--jobs", "300", "--latency-jobs", "3", "--json", str(out)),
    )
    rows = json.loads(out.read_text())
    drains = [r for r in rows if "processes" in r]
    assert [(r["variant"], r["processes"]) for r in drains] == [
        ("plain", 1), ("plain", 2), ("lazy", 1), ("lazy", 2),
    ]  # fmt: skip
    for row in drains:
        assert row["rate"] > 0 and row["server_cpu"] >= 0 and row["worker_cpu"] >= 0
    waits = {r["variant"]: r["latency"] for r in rows if "latency" in r}
    assert set(waits) == {"plain", "lazy"}
    for (wait,) in waits.values():
        assert wait["jobs"] == 3 and wait["p50_ms"] > 0 and wait["after_return_p50_ms"] is not None
    assert "| lazy |" in printed and "after the enqueue call's return" in printed


def test_schema_variants_drain_side_by_side() -> None:
    printed = run_module(
        "bench.schema_ab",
        *("--variant", "ff70=ALTER TABLE rota.job SET (fillfactor = 70)"),
        *("--rounds", "1", "--processes", "1", "--jobs", "300"),
    )
    rows = [line for line in printed.splitlines() if line.startswith(("| current |", "| ff70 |"))]
    assert len(rows) == 2, printed
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1].replace(",", "")) > 0 and float(cells[5].replace(",", "")) > 0


@pytest.mark.parametrize("variant", ["no-sql", "=SELECT 1", "label="])
def test_a_schema_variant_without_a_label_or_sql_is_refused(variant: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.schema_ab", "--variant", variant],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--variant wants LABEL=SQL" in done.stderr


def test_floor_shapes_drain_beside_the_worker(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    printed = run_module("bench.floor", "--rounds", "1", "--jobs", "300", "--json", str(out))
    drains = json.loads(out.read_text())["drains"]
    assert set(drains) >= {
        "Rota's worker", "one write", "claim, delete", "claim, mark done",
        "claim, mark done, on Rota's table", "claim, move to history, on Rota's table split",
    }  # fmt: skip
    for name, by_processes in drains.items():
        for processes in ("1", "2"):
            (drain,) = by_processes[processes]
            assert drain["rate"] > 0 and drain["server_cpu_seconds"] >= 0, (name, processes)
    assert "| claim, mark done, on Rota's table | 2 |" in printed


def test_floor_runs_only_the_setups_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    run_module(
        "bench.floor", "--rounds", "1", "--jobs", "200", "--json", str(out),
        "--only", "claim-move-to-history-on-rotas-table-split", "--only", "one-write",
    )  # fmt: skip
    drains = json.loads(out.read_text())["drains"]
    assert set(drains) == {"claim, move to history, on Rota's table split", "one write"}

    done = subprocess.run(
        [sys.executable, "-m", "bench.floor", "--only", "one-wrte", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--only: no setup one-wrte (setups: rotas-worker, one-write," in done.stderr


def test_feature_costs_price_every_feature_and_all_of_them(tmp_path: Path) -> None:
    out = tmp_path / "features.json"
    printed = run_module(
        "bench.feature_costs", "--rounds", "1", "--statements", "1", "--batch", "20",
        "--json", str(out),
    )  # fmt: skip
    costs = json.loads(out.read_text())["us_per_job"]
    variants = list(costs)
    assert len(variants) == 11
    assert variants[0] == "the schema `rota migrate` makes" and variants[-1] == "all of them off"
    for variant, by_statement in costs.items():
        assert set(by_statement) == {"enqueue", "claim", "outcome"}, variant
        assert all(us > 0 for us in by_statement.values()), variant
    assert "| no type index |" in printed

    done = subprocess.run(
        [sys.executable, "-m", "bench.feature_costs", "--batch", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--rounds, --statements and --batch must be positive" in done.stderr
