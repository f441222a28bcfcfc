"""`make bench-web`: the console's server time per page with a million jobs.

Starts a throwaway PostgreSQL, fills rota.job with `--jobs` rows shaped like a
busy queue (mostly done, some ready, running, failed, dead and cancelled, with
payloads and keys), and requests every page through the ASGI app in-process,
so the time is the server's: routing, queries and rendering, no network.

    python -m bench.web_pages [--jobs 1000000] [--requests 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.measure import percentile

# The shape of the table: per million jobs, how many of each status.
SHAPE = {"ready": 20_000, "running": 1_000, "failed": 5_000, "dead": 10_000, "cancelled": 4_000}
TYPES = 7


def fill(conn: psycopg.Connection[Any], jobs: int = 1_000_000) -> dict[str, int]:
    """Insert `jobs` rows in a few statements; returns ids worth looking at."""
    scale = jobs / 1_000_000
    counts = {status: max(1, int(n * scale)) for status, n in SHAPE.items()}
    counts["done"] = jobs - sum(counts.values())
    # The done counter trigger bumps one row per statement; filled in below as
    # migration 0003 does, as the metrics tests do.
    conn.execute("ALTER TABLE rota.job DISABLE TRIGGER job_done_count_insert")
    for status, n in counts.items():
        conn.execute(
            "INSERT INTO rota.job (type, status, payload, idempotency_key, run_at, attempts,"
            " max_attempts, locked_by, locked_until, last_error, created_at, started_at,"
            " finished_at, priority)"
            " SELECT 'type' || (i %% %(types)s),"
            "  %(status)s,"
            "  jsonb_build_object('n', i, 'shop', i %% 100, 'to', 'user' || i || '@example.com'),"
            "  CASE WHEN i %% 10 = 0 THEN %(status)s || '-' || i END,"
            "  now() - make_interval(secs => %(n)s - i)"
            "     + CASE WHEN %(status)s = 'ready' AND i %% 4 = 0"
            "            THEN interval '1 hour' ELSE interval '0' END,"
            "  1, 3,"
            "  CASE WHEN %(status)s = 'running' THEN 'worker-' || (i %% 8) END,"
            "  CASE WHEN %(status)s = 'running' THEN now() + interval '30 seconds' END,"
            "  CASE WHEN %(status)s IN ('failed', 'dead')"
            "       THEN (ARRAY['ValueError', 'TimeoutError', 'KeyError'])[i %% 3 + 1]"
            "            || ': it broke' || E'\\n  File \"h.py\", line 1' END,"
            "  now() - make_interval(secs => %(n)s - i),"
            "  CASE WHEN %(status)s <> 'ready' THEN now() END,"
            "  CASE WHEN %(status)s IN ('done', 'failed', 'dead', 'cancelled') THEN now() END,"
            "  i %% 10"
            " FROM generate_series(1, %(n)s) AS i",
            {"status": status, "n": n, "types": TYPES},
        )
    conn.execute("ALTER TABLE rota.job ENABLE TRIGGER job_done_count_insert")
    conn.execute(
        "INSERT INTO rota.job_done_count (type, shard, count)"
        " SELECT type, 0, count(*) FROM rota.job WHERE status = 'done' GROUP BY type"
    )
    # Seven days of minute samples, for the queue and per type, as the charts read them.
    conn.execute(
        "INSERT INTO rota.queue_sample"
        " SELECT m, n * 100, n, 10, 5, 3.0 FROM generate_series("
        "  date_trunc('minute', now()) - interval '7 days', date_trunc('minute', now()),"
        "  interval '1 minute') WITH ORDINALITY AS s(m, n)"
    )
    conn.execute(
        "INSERT INTO rota.queue_sample_type"
        " SELECT m, 'type' || t, n * (10 + t), n, 1, 1, (t * 7 + n %% 60)::float8"
        " FROM generate_series("
        "  date_trunc('minute', now()) - interval '7 days', date_trunc('minute', now()),"
        "  interval '1 minute') WITH ORDINALITY AS s(m, n), generate_series(0, %(types)s - 1) AS t",
        {"types": TYPES},
    )
    conn.execute("VACUUM ANALYZE rota.job")
    conn.execute("VACUUM ANALYZE rota.queue_sample")
    conn.execute("VACUUM ANALYZE rota.queue_sample_type")
    row = conn.execute(
        "SELECT (SELECT max(id) FROM rota.job WHERE status = 'dead') AS dead,"
        " (SELECT max(id) FROM rota.job WHERE status = 'done') AS done"
    ).fetchone()
    assert row is not None
    dead, done = row.values() if isinstance(row, dict) else row
    return {"dead": int(dead), "done": int(done)}


def pages(ids: dict[str, int]) -> list[tuple[str, str]]:
    """(name, path) of every page, with the filters people use most."""
    return [
        ("overview", "/"),
        ("overview 24h", "/?range=24h"),
        ("overview 7d", "/?range=7d"),
        ("jobs", "/jobs"),
        ("jobs status=dead", "/jobs?status=dead"),
        ("jobs status=ready type", "/jobs?status=ready&type=type3"),
        ("jobs type", "/jobs?type=type3"),
        ("jobs payload key=value", "/jobs?payload=shop%3D42"),
        ("jobs payload JSON", "/jobs?payload=%7B%22n%22%3A+12345%7D"),
        ("jobs key", "/jobs?key=dead-40"),
        ("jobs created range", "/jobs?created_from=2000-01-01&created_to=2001-01-01"),
        ("jobs next page", f"/jobs?before={ids['done'] - 5000}"),
        ("job", f"/jobs/{ids['dead']}"),
        ("bulk confirm retry dead", "/jobs/bulk?action=retry&status=dead&type=type1"),
        ("dead letters", "/dead"),
        ("schedules", "/schedules"),
        ("types", "/types"),
        ("workers", "/workers"),
        ("audit", "/audit"),
    ]


def measure(dsn: str, ids: dict[str, int], requests: int) -> dict[str, dict[str, float]]:
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

    from rota import workers
    from rota.web import AuthSettings, WebSettings, create_app

    for i in range(8):
        workers.register(dsn, workers.WorkerInfo(f"worker-{i}", concurrency=8))
    app = create_app(WebSettings(dsn=dsn, auth=AuthSettings(token="bench"), sample_seconds=0))
    results: dict[str, dict[str, float]] = {}
    with TestClient(app) as client:
        headers = {"Authorization": "Bearer bench", "Accept": "text/html"}
        for name, path in pages(ids):
            times = []
            for _ in range(requests + 2):
                start = time.perf_counter()
                response = client.get(path, headers=headers)
                times.append((time.perf_counter() - start) * 1000)
                if response.status_code != 200:
                    raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
            times = times[2:]  # the first requests warm caches and the pool
            results[name] = {
                "p50_ms": percentile(times, 0.5),
                "p95_ms": percentile(times, 0.95),
                "max_ms": max(times),
            }
    return results


def table(results: dict[str, dict[str, float]], jobs: int) -> str:
    lines = [f"Console pages, server time with {jobs:,} jobs (ms)", ""]
    lines.append(f"{'page':<28}{'p50':>8}{'p95':>8}{'max':>8}")
    for name, r in results.items():
        lines.append(f"{name:<28}{r['p50_ms']:>8.1f}{r['p95_ms']:>8.1f}{r['max_ms']:>8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None, say: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="bench.web_pages", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    logging.getLogger("rota").setLevel(logging.ERROR)

    import rota
    from rota.testing import EmbeddedPostgres

    with EmbeddedPostgres() as pg:
        dsn = pg.url()
        rota.migrate(dsn)
        say(f"filling rota.job with {args.jobs:,} rows ...")
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids = fill(conn, args.jobs)
        results = measure(dsn, ids, args.requests)
    say(table(results, args.jobs))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as out:
            json.dump({"jobs": args.jobs, "pages": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
