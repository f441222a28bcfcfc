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
    ("cancellable_of_type", {"type": RARE, "status": None}),
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


def test_a_cancel_by_type_reads_only_the_types_cancellable_rows_then_cancels_by_id(
    million: psycopg.Connection[Any],
) -> None:
    # It reads the ids of every ready, waiting and running job of the type at
    # once (so that a job changing status meanwhile is seen), through each
    # status's index, and no row of another status; each batch is then
    # cancelled by id.
    params = {"type": "type1", "status": None}
    counted = million.execute(
        "SELECT count(*) AS n FROM rota.job WHERE type = 'type1'"
        " AND status IN ('ready', 'waiting', 'running')"
    ).fetchone()
    assert counted is not None and counted["n"] > 3 * control.BATCH_SIZE
    plan = _plan(million, "cancellable_of_type", params)
    nodes = _nodes(plan)
    text = json.dumps(plan)
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), text
    assert plan["Actual Rows"] == counted["n"]
    assert max(n["Actual Rows"] * n.get("Actual Loops", 1) for n in nodes) <= counted["n"], text
    ids = [r["id"] for r in million.execute(sql.query("cancellable_of_type"), params)]
    batch = {"ids": ids[: control.BATCH_SIZE], "status": None, "now": None}
    plan = _plan(million, "cancel_jobs", batch)
    nodes = _nodes(plan)
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), json.dumps(plan)
    assert max(n["Actual Rows"] * n.get("Actual Loops", 1) for n in nodes) <= 3 * control.BATCH_SIZE
