"""The named-query loader."""

from __future__ import annotations

import pytest

from rota import sql


def test_parse_splits_named_blocks() -> None:
    text = "-- name: a\nSELECT 1;\n\n-- name: b\n-- a comment\nSELECT 2\n"
    assert sql.parse(text) == {"a": "SELECT 1", "b": "-- a comment\nSELECT 2"}


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        sql.parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


def test_every_shipped_query_loads_and_unknown_names_fail() -> None:
    assert "FOR UPDATE SKIP LOCKED" in sql.query("claim_jobs")
    with pytest.raises(KeyError):
        sql.query("no_such_query")


def test_migrations_are_numbered_once_each_in_order() -> None:
    # Numbers are handed out ahead of the changes that need them, so one may be
    # missing for a while; migrate() applies whatever is not applied yet.
    numbers = [number for number, _, _ in sql.migrations()]
    assert numbers[0] == 1
    assert numbers == sorted(set(numbers))
