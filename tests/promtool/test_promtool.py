"""The alerting rules under Prometheus's own tools: `promtool check rules` and the
`promtool test rules` cases of alerts_test.yaml (firing and not, for every alert).

promtool comes with Debian's prometheus package, which `make install` installs
when it may (as root with apt-get); without it these tests are skipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent
RULES = HERE.parents[1] / "charts" / "rota" / "files" / "alerts.yaml"
CASES = HERE / "alerts_test.yaml"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus; make install)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=HERE, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_rules_pass_promtool_check():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_every_alert_case_passes_promtool_test_rules():
    result = promtool("test", "rules", CASES.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    firing, quiet = set(), set()
    for case in yaml.safe_load(CASES.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == alerts, alerts - firing
    assert quiet == alerts, alerts - quiet
