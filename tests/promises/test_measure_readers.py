"""The measures survive any row the tables can hold.

Rows written around every trigger (by a superuser with
``session_replication_role = replica``) sit beside ordinary jobs: job types
with line breaks, quotes, backslashes, 3,000 bytes and odd unicode; times of
infinity, -infinity, the year 20000 and 4713 BC; NaN and Infinity timeouts;
counts at both ends of a bigint in the trigger-kept counters; schedules whose
missed slots sit at the edges of a bigint; paused types, limits and workers of
odd names. The queue exporter's /metrics, the operator's /metrics, `rota
status` (text and JSON) and a worker's /metrics answer, in a form their readers
accept, and keep showing the ordinary rows as they are.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import rota
from rota.cli import main
from rota.jobs import Outcome
from rota.metrics import (
    MetricsSettings,
    RunCounter,
    WorkerCollector,
    metrics_page,
    queue_registry,
    serve_pages,
)

BIG = 2**63 - 1
SMALL = -(2**63)
ODD_TYPES = ["new\nline", 'quo"te', "back\\slash", "x" * 3000, "\u2028\ufeff\u0301\U0001f600"]

AROUND_THE_TRIGGERS = f"""
SET session_replication_role = replica;
INSERT INTO rota.job (type, run_at) VALUES ('*', now()), ('other', now()), ('', now());
INSERT INTO rota.job (type, run_at)
    VALUES ('t.infinity', 'infinity'), ('t.minus', '-infinity'),
           ('t.year', '20000-01-01Z'), ('t.bc', '4713-01-01 BC');
INSERT INTO rota.job (type, created_at)
    VALUES ('t.created', 'infinity'), ('t.created', '-infinity');
INSERT INTO rota.job (type, timeout_seconds) VALUES ('t.nan', 'NaN'), ('t.nan', 'Infinity');
INSERT INTO rota.job (type, status, locked_by, locked_until, attempts)
    VALUES ('t.running', 'running', E'w\\n"', 'infinity', 1);
INSERT INTO rota.job_done_count (type, shard, count)
    VALUES ('done.big', 1, {BIG}), ('done.big', 2, {BIG}),
           ('done.small', 1, {SMALL}), ('done.small', 2, {SMALL}), ('done.minus', 1, -5);
INSERT INTO rota.job_dead_count (type, shard, count)
    VALUES ('dead.big', 1, {BIG}), ('dead.big', 2, {BIG}),
           ('dead.small', 1, {SMALL}), ('dead.small', 2, {SMALL}), ('dead.minus', 1, -5);
INSERT INTO rota.job_failure_count (minute, type, count)
    VALUES (date_trunc('minute', now()), 'f', {BIG}), (date_trunc('minute', now()), 'f', {BIG}),
           ('infinity', 'f', {SMALL});
INSERT INTO rota.lease_expiration (hour, count)
    VALUES (date_trunc('hour', now(), 'UTC'), {BIG}),
           (date_trunc('hour', now(), 'UTC') - interval '1 hour', {BIG}),
           (date_trunc('hour', now(), 'UTC') - interval '2 hours', {SMALL}),
           ('infinity', 5), ('-infinity', {SMALL});
INSERT INTO rota.schedule (name, job_type, cron, next_run_at, missed_slots, skipped_slots)
    VALUES (E'n\\nl"\\\\', E'j\\n"', '* * * * *', 'infinity', {BIG}, {SMALL}),
           ('minus', 't', '* * * * *', '-infinity', {SMALL}, -1),
           (repeat('s', 3000), repeat('y', 3000), '* * * * *', '20000-01-01Z',
            2147483647, 2147483648);
INSERT INTO rota.paused_type (type, paused_at)
    VALUES ('*', 'infinity'), (E'p\\nq', '-infinity'), (repeat('p', 3000), now());
INSERT INTO rota.job_limit (type, concurrency)
    VALUES (E'l\\nq"', 1), ('*', 2), (repeat('l', 3000), 2147483647);
INSERT INTO rota.worker (id, concurrency, expires_at)
    VALUES (E'w\\n"', 1, 'infinity'), ('', 2147483647, '-infinity'),
           (repeat('w', 3000), 1, '20000-01-01Z');
INSERT INTO rota.queue_sample (minute, done_total, ended_total, ready_due, running,
                               oldest_ready_age_seconds)
    VALUES (date_trunc('minute', now()), {BIG}, {SMALL}, 1, 1, 'NaN'),
           (date_trunc('minute', now()) - interval '1 minute', 1, 1, 1, 1, 'Infinity');
RESET session_replication_role;
"""


@pytest.fixture
def hostile(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The bad rows beside ordinary ones: two ordinary jobs ready, one dead, and a
    live worker (its presence lock held here) whose row never expires."""
    rota.enqueue(conn, "ordinary", {"n": 1})
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        "INSERT INTO rota.job (type, run_at)"
        " SELECT t, now() - interval '1 minute' FROM unnest(%s::text[]) AS t",
        (ODD_TYPES,),
    )
    conn.execute(AROUND_THE_TRIGGERS)  # type: ignore[arg-type]
    rota.enqueue(conn, "ordinary", {"n": 2})
    dead = rota.enqueue(conn, "ordinary", {"n": 3})
    conn.execute("UPDATE rota.job SET status = 'dead', attempts = 3 WHERE id = %s", (dead,))
    conn.execute("SELECT pg_advisory_lock(1383036001, hashtext(E'w\\n\"'))")
    yield


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition; a series given twice fails."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in found, f"{key[0]}{dict(key[1])} given twice"
            found[key] = sample.value
    return found


def _check_queue_measures(text: str) -> None:
    samples = _samples(text)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("rota_queue_exporter_leader") == 1
    assert value("rota_jobs", status="ready", type="ordinary") == 2
    assert value("rota_jobs", status="dead", type="ordinary") == 1
    assert value("rota_dead_jobs") == 1
    assert value("rota_workers") == 1
    for job_type in ODD_TYPES:
        assert value("rota_jobs", status="ready", type=job_type) == 1
        assert 59 <= value("rota_oldest_ready_job_age_seconds", type=job_type) < 3600
    assert value("rota_jobs", status="done", type="done.big") == float(BIG)
    assert value("rota_jobs", status="done", type="done.small") == 0
    assert value("rota_jobs_dead_total", type="dead.big") == float(BIG)
    assert value("rota_jobs_dead_total", type="dead.small") == 0
    assert value("rota_lease_expirations_total") == float(BIG)
    assert value("rota_schedule_missed_slots_total", schedule='n\nl"\\', type='j\n"') == float(BIG)
    assert value("rota_schedule_missed_slots_total", schedule="minus", type="t") == 0
    assert value("rota_job_type_paused", type="*") == 1
    for (name, _), number in samples.items():
        assert not math.isnan(number), name
        if name.endswith("_total"):
            assert number >= 0, name  # a counter is never below 0


def test_the_exporter_serves_every_row(hostile: None, db_url: str) -> None:
    registry = queue_registry(db_url, cache_seconds=0)
    server = serve_pages("127.0.0.1", 0, {"/metrics": metrics_page(registry)}, "exporter")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        server.shutdown()
    _check_queue_measures(text)


def test_the_operator_serves_every_row(hostile: None, db_url: str) -> None:
    from rota_operator import metrics

    async def scrape() -> tuple[int, str]:
        runner, port = await metrics.serve("127.0.0.1", 0)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/metrics") as response,
            ):
                return response.status, await response.text()
        finally:
            await runner.cleanup()

    metrics.serve_database_measures(db_url)
    try:
        status, text = asyncio.run(scrape())
    finally:
        for collector in list(metrics.REGISTRY._collector_to_names):
            if isinstance(collector, metrics.QueueCollector):
                metrics.REGISTRY.unregister(collector)
                collector.close_connection()
    assert status == 200
    _check_queue_measures(text)


def _strict(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def test_rota_status_reads_every_row(
    hostile: None,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["status"]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "ordinary" in text and "new\\nline" in text and "Workers alive: 1" in text
    assert main(["status", "--json"]) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out, parse_constant=_strict)
    ordinary = data["types"]["ordinary"]
    assert (ordinary["ready"], ordinary["dead"]) == (2, 1)
    assert data["dead_jobs"] == 1 and data["workers"] == 1
    assert data["types"]["done.big"]["done"] == BIG
    assert data["types"]["done.small"]["done"] == 0
    assert data["lease_expirations"]["total"] == BIG
    assert data["lease_expirations"]["current_hour"] == BIG
    missed = {s["name"]: s["missed_slots"] for s in data["schedules"]}
    assert missed['n\nl"\\'] == BIG and missed["minus"] == 0
    assert {job_type for job_type in ODD_TYPES} <= set(data["types"])


def test_a_worker_serves_odd_types_and_values() -> None:
    # What a worker counts comes from the rows it claims: their types, and
    # attempts of any integer; a duration past every bucket.
    from rota_worker.probes import serve

    runs = RunCounter(MetricsSettings(max_types=4))
    runs.declare(ODD_TYPES[:2])
    odd = [*ODD_TYPES, "", "other", "*"]
    runs.record(
        (job_type, Outcome.DONE, duration, attempts)
        for job_type in odd
        for duration, attempts in [(math.nan, 2**31 - 1), (1e308, -(2**31)), (-1.0, 0)]
    )
    runs.record((job_type, Outcome.RETRY, 0.5, 1) for job_type in odd)
    registry = CollectorRegistry()
    registry.register(runs)
    registry.register(WorkerCollector(1, lambda: [*odd, "never\nseen"], runs))
    server = serve(0, lambda: {"ready": True}, lambda: None, lambda: generate_latest(registry),
                   host="127.0.0.1")  # fmt: skip
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
            samples = _samples(response.read().decode())
    finally:
        server.shutdown()
    finished = {
        labels: n for (name, labels), n in samples.items() if name == "rota_jobs_finished_total"
    }
    assert finished[(("outcome", "done"), ("type", "new\nline"))] == 3
    assert finished[(("outcome", "retry"), ("type", 'quo"te'))] == 1
    running = {
        dict(labels)["type"]: n for (name, labels), n in samples.items()
        if name == "rota_worker_running_jobs"
    }  # fmt: skip
    assert running["new\nline"] == 1 and running["other"] == len(odd) + 1 - 4
