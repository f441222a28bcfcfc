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


def test_statements_are_sent_without_their_comment_lines() -> None:
    text = "-- why\nSELECT 1  -- kept: not a line of its own\n    -- indented\nFROM t\n-- last"
    assert sql.without_comment_lines(text) == "SELECT 1  -- kept: not a line of its own\nFROM t"


def test_the_hot_statements_stay_short_enough_for_psycopg_to_keep_them_parsed() -> None:
    # psycopg parses a statement longer than this every time it is run (its
    # cache keeps only shorter ones): the claim, with the comments that explain
    # it, was 4,305 bytes, parsed again on each claim.
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    from rota import claim

    types = ("bench.latency", "bench.noop", "rota.archive")
    for text in (
        claim._claim_statement(types),
        sql.query("write_outcomes"),
        sql.query("extend_leases"),
    ):
        assert "\n--" not in text
        assert len(text) <= MAX_CACHED_STATEMENT_LENGTH
