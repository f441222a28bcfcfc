"""The console's code a reader can hold: one routes module per page area, and no
function in rota.web longer than 100 lines (a page's handler, its reads, its
checks each stand alone)."""

from __future__ import annotations

import ast
from pathlib import Path

import rota.web

WEB = Path(rota.web.__file__).parent
LONGEST = 100


def function_lengths(source: str) -> dict[str, int]:
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            found[f"{node.name}:{node.lineno}"] = node.end_lineno - node.lineno + 1
    return found


def test_no_function_of_the_console_is_over_100_lines() -> None:
    long = {
        f"{path.relative_to(WEB)}:{name}": size
        for path in sorted(WEB.rglob("*.py"))
        for name, size in function_lengths(path.read_text()).items()
        if size > LONGEST
    }
    assert long == {}


def test_each_page_area_has_its_routes_module() -> None:
    areas = {p.stem for p in (WEB / "routes").glob("*.py")} - {"__init__", "acting"}
    assert areas == {"overview", "jobs", "dead", "schedules", "types", "workers", "audit", "login"}
