"""The operator's /metrics and /healthz endpoints."""

from __future__ import annotations

import asyncio

import aiohttp

from rota_operator import metrics


async def _fetch(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as r,
    ):
        return r.status, await r.text()


async def _scrape() -> dict[str, tuple[int, str]]:
    runner, port = await metrics.serve("127.0.0.1", 0)
    try:
        return {path: await _fetch(port, path) for path in ("/metrics", "/healthz", "/nope")}
    finally:
        await runner.cleanup()


def test_metrics_and_health_are_served() -> None:
    metrics.record_replicas("ns/pool", desired=3, current=2)
    metrics.record_error("workerpools", "TargetNotFound")
    pages = asyncio.run(_scrape())
    status, text = pages["/metrics"]
    assert status == 200
    assert 'rota_workerpool_replicas{kind="desired",pool="ns/pool"} 3.0' in text
    assert 'rota_workerpool_replicas{kind="current",pool="ns/pool"} 2.0' in text
    assert (
        'rota_operator_reconcile_errors_total{reason="TargetNotFound",resource="workerpools"}'
        in text
    )
    assert "_created" not in text
    assert pages["/healthz"] == (200, "ok\n")
    assert pages["/nope"][0] == 404

    metrics.forget_pool("ns/pool")
    assert "ns/pool" not in asyncio.run(_scrape())["/metrics"][1]


def test_the_operator_also_serves_the_database_measures(db_url: str) -> None:
    import rota

    rota.enqueue(db_url, "report.build")
    metrics.serve_database_measures(db_url)
    metrics.serve_database_measures(db_url)  # again: still one collector
    try:
        text = asyncio.run(_scrape())["/metrics"][1]
    finally:
        for collector in list(metrics.REGISTRY._collector_to_names):
            if isinstance(collector, metrics.QueueCollector):
                metrics.REGISTRY.unregister(collector)
    assert 'rota_jobs{status="ready",type="report.build"} 1.0' in text
    assert "rota_oldest_ready_job_age_seconds" in text
