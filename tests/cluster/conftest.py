"""The real-cluster run prints what it measured at the end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

MEASURES = Path(__file__).resolve().parents[2] / "build" / "cluster-measures.json"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if os.environ.get("ROTA_CLUSTER_TESTS") != "1" or not MEASURES.exists():
        return
    terminalreporter.section("measured on the local cluster")
    for name, seconds in json.loads(MEASURES.read_text()).items():
        terminalreporter.write_line(f"{name:40} {seconds:8.1f} s")
