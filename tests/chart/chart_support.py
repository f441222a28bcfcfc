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

import yaml

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
    set_strings: Sequence[str] = (),
    chart: Path = CHART,
) -> str:
    """`helm template` output (hooks included) for the given values."""
    args = ["template", "rota", str(chart), "--namespace", "rota"]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set", item]
    for item in set_strings:
        args += ["--set-string", item]
    for api in api_versions:
        args += ["--api-versions", api]
    done = run_helm(helm, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


class StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with the same key twice.

    yaml.safe_load keeps the last of two equal keys; the API server may refuse
    the object or keep either, so a rendered manifest must never hold one.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_strict(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=StrictLoader) if doc]


# helm renders NOTES.txt only for install and upgrade, which need a cluster. A copy
# of the chart with NOTES.txt moved out of templates/ and a template that renders
# it with `tpl` into a ConfigMap gives the same text offline, through `helm template`.
NOTES_TEMPLATE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: release-notes
data:
  notes: {{ tpl (.Files.Get "release-notes.txt") . | toJson }}
"""


def notes_chart(into: Path) -> Path:
    """A copy of the chart whose `helm template` output holds its NOTES in a ConfigMap."""
    copy = into / "rota"
    shutil.copytree(CHART, copy)
    (copy / "templates" / "NOTES.txt").rename(copy / "release-notes.txt")
    (copy / "templates" / "release-notes.yaml").write_text(NOTES_TEMPLATE)
    return copy
