"""Installing Rota into one's own project, as the README says: the extras bring
what their documented examples import."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["optional-dependencies"])


def test_the_sqlalchemy_extra_brings_greenlet_for_async_sessions() -> None:
    # SQLAlchemy's asyncio extra requires greenlet; an AsyncSession fails to import without it.
    assert any(r.startswith("sqlalchemy[asyncio]") for r in extras()["sqlalchemy"])


def test_the_readme_says_how_to_install_rota_into_a_project() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Install Rota into your project") :]
    assert "pip install" in section and "rota[web]" in section and "rota migrate" in section
