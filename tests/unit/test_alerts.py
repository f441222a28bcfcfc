"""The alerting rules shipped in the chart: well formed, documented, reading real metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from promql_names import SCRAPE_SERIES, known_metrics, metric_names

ROOT = Path(__file__).parents[2]
ALERTS = ROOT / "charts" / "rota" / "files" / "alerts.yaml"
EXPECTED = {
    "RotaDeadJobsPresent",
    "RotaDeadJobsGrowing",
    "RotaQueueAgeHigh",
    "RotaLeaseExpirationsHigh",
    "RotaScheduleSlotsMissed",
    "RotaWorkersAbsent",
    "RotaQueueExporterAbsent",
    "RotaTargetDown",
}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


RUNBOOKS = "docs/observability.md"


def anchors() -> set[str]:
    """The anchors of the headings of the page that holds the runbooks."""
    text = (ROOT / RUNBOOKS).read_text()
    return {
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^#+\s+(.+)$", text, re.MULTILINE)
    }


def test_the_promised_alerts_ship():
    names = [rule["alert"] for rule in rules()]
    assert sorted(names) == sorted(EXPECTED)


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_rule_reads_existing_metrics(rule):
    names = metric_names(rule["expr"])
    assert names - SCRAPE_SERIES, rule["expr"]  # at least one of Rota's own
    assert names <= known_metrics() | SCRAPE_SERIES, names - known_metrics()


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_rule_has_severity_summary_duration_and_runbook(rule):
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert re.fullmatch(r"\d+[smh]", rule["for"])
    summary = rule["annotations"]["summary"]
    assert summary and summary.count("{{") == summary.count("}}")
    page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
    assert page == RUNBOOKS and anchor == rule["alert"].lower()
    assert anchor in anchors(), f"no runbook section for {rule['alert']}"


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_rule_groups_every_aggregation_by_installation(rule):
    """No aggregation sums or maxes over two installations: each keeps namespace
    and job (absent() aside, which says that no installation has a series)."""
    groupings = re.findall(r"\b(?:sum|max|min|group|count)\s+by\s*\(([^)]*)\)", rule["expr"])
    assert groupings, rule["expr"]
    for labels in groupings:
        assert {"namespace", "job"} <= {label.strip() for label in labels.split(",")}, labels
    assert not re.search(r"\b(?:sum|max|min|count|group)\s*\(", rule["expr"]), rule["expr"]
    assert "delta(" not in rule["expr"]  # growth comes from counters


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_summary_prints_numbers_for_people(rule):
    """{{ $value }} alone prints 26.340753595295375: every value goes through a format."""
    summary = rule["annotations"]["summary"]
    assert not re.search(r"\{\{\s*\$value\s*\}\}", summary), summary
