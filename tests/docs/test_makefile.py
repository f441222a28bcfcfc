"""The Makefile as a newcomer meets it: `make help` lists demo and test first,
and `make docs` installs only what the site is built with."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

if shutil.which("make") is None:
    pytest.skip("make is not installed", allow_module_level=True)


def make(*args: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
        check=True, timeout=120,
    )  # fmt: skip
    return done.stdout


def test_make_help_lists_demo_and_test_first() -> None:
    names = [re.sub(r"\x1b\[[0-9;]*m", "", line).split()[0] for line in make("help").splitlines()]
    assert names[:2] == ["demo", "test"]
    assert len(names) == len(set(names))
    assert names.index("bench") > names.index("lint")


def test_make_docs_installs_the_docs_extra_only() -> None:
    plan = make("-n", "-W", "pyproject.toml", "docs")
    installs = [line for line in plan.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("'.[docs]'" in line for line in installs), installs
    assert ".venv-docs/bin/mkdocs build --strict" in plan
