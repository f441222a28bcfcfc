"""The alerting rules shipped in the chart: well formed, documented, reading real metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from promql_names import known_metrics, metric_names

ROOT = Path(__file__).parents[2]
ALERTS = ROOT / "charts" / "rota" / "files" / "alerts.yaml"
EXPECTED = {
    "RotaDeadJobsPresent",
    "RotaDeadJobsGrowing",
    "RotaQueueAgeHigh",
    "RotaLeaseExpirationsHigh",
    "RotaScheduleSlotsMissed",
    "RotaWorkersAbsent",
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
    assert names, rule["expr"]
    assert names <= known_metrics(), names - known_metrics()


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_rule_has_severity_summary_duration_and_runbook(rule):
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert re.fullmatch(r"\d+[smh]", rule["for"])
    summary = rule["annotations"]["summary"]
    assert summary and summary.count("{{") == summary.count("}}")
    page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
    assert page == RUNBOOKS and anchor == rule["alert"].lower()
    assert anchor in anchors(), f"no runbook section for {rule['alert']}"
