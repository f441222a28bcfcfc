"""Named SQL queries, loaded once from the ``.sql`` files beside this module.

A file holds blocks that start with ``-- name: some_query``; the text up to the
next such line is the query. Every value is a bound parameter (``%(name)s``);
queries that compare times take ``%(now)s`` and use ``coalesce(%(now)s, now())``
so tests can freeze the clock while production passes NULL (the database clock).
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import LiteralString, cast

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a file into its named blocks."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip().rstrip(";")
    return queries


@functools.cache
def _all() -> dict[str, str]:
    queries: dict[str, str] = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            for name, body in parse(entry.read_text(encoding="utf-8")).items():
                if name in queries:
                    raise ValueError(f"query {name!r} is defined in two files")
                queries[name] = without_comment_lines(body)
    return queries


_COMMENT_LINE = re.compile(r"^[ \t]*--.*(?:\n|\Z)", re.MULTILINE)


def without_comment_lines(text: str) -> str:
    """`text` without its lines that hold only a comment.

    The comments are for the reader of the file; statements go without them.
    With them, the claim was 4.3 KB, past the length up to which psycopg keeps
    a statement's parsed form (4,096 bytes): the worker parsed every claim
    again, and every statement sent unprepared (through a pooler) carried its
    comments to the server."""
    return _COMMENT_LINE.sub("", text).strip()


def query(name: str) -> LiteralString:
    """The text of the named query (trusted text shipped with Rota, never user input)."""
    try:
        return cast(LiteralString, _all()[name])
    except KeyError:
        raise KeyError(f"no SQL query named {name!r}") from None


def migrations() -> list[tuple[int, str, str]]:
    """(number, name, text) of every migration, in order."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found)
