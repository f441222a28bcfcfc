"""Every bulk statement of the CLI walks an index over a million jobs and
changes at most one capped batch per statement (checked with EXPLAIN ANALYZE,
rolled back, as the console's and the claim's plans are)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from bench.web_pages import fill
from rota import control, sql

RARE = "rare.type"


@pytest.fixture(scope="module")
def million(pg_server: Any, template_db: str) -> Iterator[psycopg.Connection[Any]]:
    name = "rota_bulk_plans"
    url = pg_server.create(name, template=template_db)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:  # type: ignore[arg-type]
        fill(conn, 1_000_000)
        conn.execute(
            "INSERT INTO rota.job (type, status, finished_at)"
            " SELECT %s, s, now() FROM unnest(ARRAY['ready', 'dead', 'done']) AS s",
            (RARE,),
        )
        conn.execute("ANALYZE rota.job")
        yield conn
    pg_server.drop(name)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def _plan(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The plan of the named statement with these values: run, then rolled back."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            ("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.query(name)).encode(), params
        ).fetchone()
    assert row is not None
    doc = next(iter(row.values()))
    return (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]  # type: ignore[no-any-return]


CASES = [
    ("list_jobs", {"status": None, "type": RARE, "limit": 50}),
    ("list_jobs", {"status": None, "type": "type3", "limit": 50}),
    ("list_jobs", {"status": "dead", "type": RARE, "limit": 50}),
    ("list_jobs", {"status": "ready", "type": "type2", "limit": 50}),
    ("cancel_ready_of_type", {"type": "type1", "limit": control.BATCH_SIZE, "now": None}),
    ("cancel_ready_of_type", {"type": RARE, "limit": control.BATCH_SIZE, "now": None}),
    (
        "cancel_running_of_type",
        {"type": "type1", "after": 0, "limit": control.BATCH_SIZE, "now": None},
    ),
    (
        "retry_jobs",
        {"statuses": ["dead"], "ids": None, "limit": control.BATCH_SIZE, "skip": [], "now": None},
    ),
]


@pytest.mark.parametrize(("name", "params"), CASES)
def test_bulk_statements_walk_an_index_one_capped_batch_at_a_time(
    million: psycopg.Connection[Any], name: str, params: dict[str, Any]
) -> None:
    plan = _plan(million, name, params)
    nodes = _nodes(plan)
    text = json.dumps(plan)
    assert not any(
        n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "job" for n in nodes
    ), text
    assert any(n.get("Relation Name") == "job" and "Index Name" in n for n in nodes), text
    # No node reads more than a batch's worth of jobs, whatever the table holds
    # (a common type's 20,000 ready rows included).
    read = max(n["Actual Rows"] * n.get("Actual Loops", 1) for n in nodes)
    assert read <= 3 * control.BATCH_SIZE, text
