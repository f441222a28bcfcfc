"""The Grafana dashboard shipped in the chart: valid, complete, and reading real metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from promql_names import known_metrics, labelled_metrics, metric_names

DASHBOARD = Path(__file__).parents[2] / "charts" / "rota" / "files" / "dashboard.json"
# Section 7 of the design: every measure has a place on the dashboard.
MEASURES = {
    "rota_oldest_ready_job_age_seconds",
    "rota_jobs",
    "rota_running_jobs",
    "rota_job_attempts_bucket",
    "rota_lease_expirations_total",
    "rota_dead_jobs",
    "rota_schedule_missed_slots_total",
    "rota_jobs_finished_total",
    "rota_job_duration_seconds_bucket",
    "rota_workerpool_replicas",
    "rota_workers",
    "rota_job_type_paused",
    "rota_jobs_dead_total",
    "rota_worker_slots",
    "rota_worker_running_jobs",
}
TYPED = labelled_metrics("type")
"""The metrics whose series have a `type` label: every read of one is narrowed to $type."""
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", ()))
    return found


def targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in panels(dashboard) for t in p.get("targets", ())]


def reads(expr: str) -> list[tuple[str, str]]:
    """Each read of one of Rota's metrics in `expr`: (name, its {matchers} or "")."""
    found = re.findall(r'(?<![\w"$])([a-z_:][\w:]*)\s*(\{[^{}]*\})?', expr)
    return [(name, matchers) for name, matchers in found if name in known_metrics()]


def untyped_reads(expr: str) -> list[str]:
    """The reads of a per-type metric in `expr` (bare, or with matchers) that do not
    select `type=~"$type..."`."""
    return [
        name + matchers
        for name, matchers in reads(expr)
        if name in TYPED and not re.search(r'\btype\s*=~\s*"\$type\b', matchers)
    ]


def test_every_panel_query_names_only_existing_metrics(dashboard):
    known = known_metrics()
    for title, target in targets(dashboard):
        names = metric_names(target["expr"])
        assert names <= known, (title, names - known)
        assert names or target["legendFormat"] == "target", (title, target["expr"])


def test_every_measure_is_on_the_dashboard(dashboard):
    used = set().union(*(metric_names(t["expr"]) for _, t in targets(dashboard)))
    assert used >= MEASURES, MEASURES - used


def test_the_panels_the_docs_promise(dashboard):
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for words in (
        "oldest ready",
        "desired vs current",
        "throughput by outcome",
        "p50 / p95",
        "dead-letter",
        "lease expirations per hour",
        "missed",
    ):
        assert words in titles


def test_every_read_of_a_per_type_metric_is_narrowed_to_the_chosen_types(dashboard):
    assert {"rota_jobs", "rota_job_attempts_bucket", "rota_worker_running_jobs"} <= TYPED
    assert "rota_dead_jobs" not in TYPED and "rota_workers" not in TYPED
    for title, target in targets(dashboard):
        assert untyped_reads(target["expr"]) == [], title


READS_WITHOUT_TYPE = [
    ('sum(rate(rota_jobs_finished_total{job=~"$job"}[5m]))',
     ['rota_jobs_finished_total{job=~"$job"}']),
    ("max by (type) (rota_oldest_ready_job_age_seconds)", ["rota_oldest_ready_job_age_seconds"]),
    ('rota_jobs{type=~"$type"} / rota_running_jobs{type="x"}', ['rota_running_jobs{type="x"}']),
    ('max(rota_dead_jobs{job=~"$job"}) - rota_jobs{type=~"$type|\\*"}', []),
]  # fmt: skip


@pytest.mark.parametrize(("expr", "untyped"), READS_WITHOUT_TYPE)
def test_the_type_check_finds_a_read_that_ignores_type(expr, untyped):
    assert untyped_reads(expr) == untyped


def test_every_query_is_about_one_installation(dashboard):
    for title, target in targets(dashboard):
        expr = target["expr"]
        if not metric_names(expr):
            continue
        for name, matchers in reads(expr):
            assert 'namespace=~"$namespace"' in matchers, (title, name)
            assert 'job=~"$job"' in matchers, (title, name)
        for labels in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            assert {"namespace", "job"} <= {x.strip() for x in labels.split(",")}, (title, expr)
        assert not re.search(r"\b(?:sum|max|min|count)\s*\(", expr), (title, expr)


def test_queue_age_panel_draws_the_workerpool_target(dashboard):
    age = next(p for p in dashboard["panels"] if "Oldest ready" in p["title"])
    exprs = [t["expr"] for t in age["targets"]]
    assert "vector($target_age)" in exprs
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert float(variables["target_age"]["query"]) > 0


def test_variables_used_are_defined(dashboard):
    defined = {v["name"] for v in dashboard["templating"]["list"]} | BUILTIN_VARIABLES
    text = json.dumps(dashboard["panels"])
    used = set(re.findall(r"\$\{?(\w+)\}?", text))
    assert used <= defined, used - defined


def test_layout_has_unique_ids_and_no_overlap(dashboard):
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, p["title"]
        cells |= mine
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}"
        assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{x="y,z"}[5m]))', {"a_bucket"}),
        ("max(b) - max(b offset 1h) > 0 and on (t) c == bool 0", {"b", "c"}),
        ("histogram_quantile(0.95, sum(rate(d[$__rate_interval])) by (le))", {"d"}),
        ("vector($target_age)", set()),
    ],
)
def test_promql_reader_finds_metric_names(expr, names):
    assert metric_names(expr) == names


@pytest.mark.parametrize("expr", ["max(rate(x[5m])", "maxx(x)", "sum(x{a='b'}"])
def test_promql_reader_rejects_typos(expr):
    with pytest.raises(ValueError):
        metric_names(expr)
