"""Every query behind a console page walks an index over a million jobs: no plan
reads rota.job sequentially (checked with EXPLAIN, as the metrics tests do)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bench.web_pages import fill
from rota import sql
from rota.web.filters import JobFilter

NOW = datetime.now(UTC)
NO_FILTER = JobFilter().params()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def page_filters() -> list[dict[str, Any]]:
    """The job list's filters as the console sends them (see rota.web.reads.job_page)."""
    cases = [
        {},
        {"status": "dead"},
        {"status": "ready"},
        {"status": "running"},
        {"status": "done"},
        {"status": "cancelled", "type": "type1"},
        {"type": "type3"},
        {"key": "dead-40"},
        {"payload": json.dumps({"shop": 42})},
        {"status": "dead", "payload": json.dumps({"n": 7})},
        {"created_from": datetime(2000, 1, 1, tzinfo=UTC)},
        {"before": 500_000},
        {"status": "dead", "before": 30_000},
        {"status": "ready", "type": "type2"},
        {"status": "ready", "retrying": True},
        {"error": "SMTPError"},
        {"status": "dead", "error": "timeout"},
    ]
    found = []
    for case in cases:
        params = {**NO_FILTER, "before": None, **case}
        bounded = any(
            params[k] is not None
            for k in ("type", "payload", "error", "created_from", "created_to")
        )
        sorted_ = params["status"] not in (None, "done")
        found.append(
            {**params, "bounded": bounded, "scan": 10_000 if bounded else 51, "limit": 51,
             "sorted": sorted_}
        )  # fmt: skip
    return found


@pytest.fixture(scope="module")
def million(pg_server, template_db):
    name = "rota_web_plans"
    url = pg_server.create(name, template=template_db)
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:  # type: ignore[arg-type]
        fill(conn, 1_000_000)
        yield conn
    pg_server.drop(name)


def test_no_console_query_reads_the_job_table_sequentially(million):
    conn = million

    def seq_scans_job(name: str, params: dict[str, Any]) -> bool:
        statement = b"EXPLAIN (FORMAT JSON) " + sql.query(name).encode()
        row = conn.execute(statement, params).fetchone()
        nodes = _nodes(next(iter(row.values()))[0]["Plan"])
        return any("Seq Scan" in n["Node Type"] and n.get("Relation Name") == "job" for n in nodes)

    # The check can fail: a filter on payload over the whole table reads it all.
    conn.execute("SET enable_seqscan = on")
    whole = conn.execute(
        "EXPLAIN (FORMAT JSON) SELECT count(*) FROM rota.job WHERE payload @> '{\"n\": 1}'"
    ).fetchone()
    assert "Seq Scan" in json.dumps(whole)

    checked = []
    for params in page_filters():
        for name in ("web_jobs_page", "web_jobs_window"):
            assert not seq_scans_job(name, {**params, "now": NOW}), (name, params)
            checked.append(name)
    bulk = {**NO_FILTER, "delayed": False, "now": NOW, "cap": 100_000}
    for statuses, extra in [
        (["dead", "failed", "cancelled"], {}),
        (["dead", "failed", "cancelled"], {"type": "type2", "payload": json.dumps({"shop": 3})}),
        (["ready", "running"], {"type": "type1"}),
        (["ready", "running"], {"payload": json.dumps({"shop": 3})}),
        (["ready"], {"delayed": True}),
    ]:
        for name in ("web_bulk_count", "web_bulk_ids"):
            for one in statuses:
                assert not seq_scans_job(name, {**bulk, **extra, "one": one}), (name, one, extra)
            checked.append(name)
    singles: list[tuple[str, dict[str, Any]]] = [
        ("get_job", {"id": 12345}),
        ("web_archived_job", {"id": 12345}),
        ("web_job_effects", {"key": "rota-job:12345", "limit": 200}),
        ("web_schedule_by_id", {"id": 1}),
        ("web_dead_groups", {"limit": 200}),
        ("web_dead_group_ids", {"type": "type1", "error_class": "KeyError", "cap": 100_000}),
        ("web_set_priority", {"ids": [1, 2], "priority": 3}),
        ("web_run_now", {"ids": [1, 2], "now": NOW}),
        (
            "retry_jobs",
            {"ids": [1, 2], "statuses": ["dead"], "limit": None, "skip": None, "now": NOW},
        ),
        ("cancel_jobs", {"ids": [1, 2], "type": None, "status": None, "now": NOW}),
        ("web_audit_page", {"before": None, "limit": 51}),
        ("worker_list", {"now": NOW, "shown": 20}),
        ("worker_live_count", {"now": NOW}),
        ("queue_samples", {"now": NOW, "minutes": 60}),
        ("queue_sample_record", {"now": NOW}),
        ("web_paused_types", {}),
        ("metrics_job_counts", {"now": NOW}),
        ("schedule_list", {}),
        ("web_selected_ids", {"ids": [1, 2], "one": "dead", "delayed": False, "now": NOW}),
        ("web_known_types", {}),
        ("web_schedule_recent_jobs", {"id": 1, "limit": 5}),
        ("web_live_worker_types", {"now": NOW}),
        ("web_retrying_types", {}),
        ("web_failing_types", {"since": NOW}),
        (
            "web_chart_failures",
            {"now": NOW, "span": timedelta(days=7), "bucket": timedelta(hours=1)},
        ),
        ("web_session_alive", {"id": "x", "now": NOW}),
        ("queue_sample_type_record", {"now": NOW}),
        (
            "web_chart_samples",
            {"now": NOW, "span": timedelta(days=7), "bucket": timedelta(hours=1)},
        ),
        (
            "web_chart_type_samples",
            {"now": NOW, "span": timedelta(hours=1), "bucket": timedelta(minutes=1)},
        ),
    ]
    for name, params in singles:
        assert not seq_scans_job(name, params), name
        checked.append(name)
    assert len(set(checked)) == 33
