"""The docs site's shape: every page in the nav, the README a short front door."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"


def nav_pages(entries: list[object]) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            if isinstance(value, list):
                pages |= nav_pages(value)
            else:
                pages.add(str(value))
    return pages


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = nav_pages(config["nav"])
    on_disk = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    # Changelog entries waiting to be folded in (mkdocs.yml excludes them).
    on_disk = {page for page in on_disk if not page.startswith("changes/")}
    assert in_nav == on_disk


def test_the_readme_is_a_short_front_door_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = set(re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme))
    assert "docs/index.md" in linked
    for target in linked:
        assert (ROOT / target).exists(), target
