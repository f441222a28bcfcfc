"""Every Python block in the docs runs in a test, or says it is a fragment.

The line before a ```python fence is an HTML comment (invisible on the page):
`<!-- fragment: why it cannot run alone -->`, or `<!-- tested: tests/... -->`
naming the test that runs it. Blocks marked as tested by this file run here,
each in a process of its own, with `psycopg` and `rota` imported, `dsn` the
URL of a migrated database that has a table `orders (id integer)` and `conn`
an autocommit connection to it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).parents[2]
THIS = "tests/docs/test_code_blocks.py"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARK = re.compile(r"^\s*<!-- (fragment|tested): (.+?) -->$")
PRELUDE = (
    "import sys\n\nimport psycopg\n\nimport rota\n\n"
    "dsn = sys.argv[1]\nconn = psycopg.connect(dsn, autocommit=True)\n"
)


def blocks() -> list[tuple[str, str, str]]:
    """(where, the comment line before it, the code) of every Python block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        fences = r"^( *)```python\n(.*?)^\1```$"
        for match in re.finditer(fences, text, re.MULTILINE | re.DOTALL):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            line = text.count("\n", 0, match.start()) + 1
            code = textwrap.dedent(match.group(2))
            found.append((f"{page.relative_to(ROOT)}:{line}", before, code))
    return found


def test_every_python_block_runs_in_a_test_or_is_marked_a_fragment() -> None:
    unmarked = [where for where, before, _ in blocks() if not MARK.match(before)]
    assert not unmarked, (
        "put `<!-- fragment: why -->` or `<!-- tested: tests/... -->` on the line"
        f" before each of these Python blocks: {unmarked}"
    )
    for where, before, _ in blocks():
        kind, what = MARK.match(before).groups()  # type: ignore[union-attr]
        if kind == "tested":
            assert (ROOT / what.split()[0]).exists(), (where, what)


RUN_HERE = [(where, code) for where, before, code in blocks() if f"tested: {THIS}" in before]


@pytest.mark.parametrize(("where", "code"), RUN_HERE, ids=[w for w, _ in RUN_HERE])
def test_the_block_runs(db_url: str, where: str, code: str, tmp_path: Path) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id integer)")
    script = tmp_path / "block.py"
    script.write_text(PRELUDE + code)
    done = subprocess.run(
        [sys.executable, str(script), db_url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (where, done.stderr)
