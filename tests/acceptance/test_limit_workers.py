"""Limits binding several `rota worker` processes at once against one database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

import rota
from tests.acceptance.procs import WorkerProcess, wait_for

JOBS = 60


def most_at_once(conn: psycopg.Connection[Any], by_group: bool) -> int:
    """The most handler runs that overlapped (per group, or in all)."""
    same_group = "AND b.group_key = a.group_key" if by_group else ""
    row = conn.execute(
        "SELECT max(n) AS most FROM (SELECT a.job_id, count(*) AS n FROM spans a JOIN spans b"
        " ON b.started_at <= a.started_at AND b.ended_at > a.started_at " + same_group + ""
        " GROUP BY a.job_id) AS o"
    ).fetchone()
    return int(row["most"])  # type: ignore[index]


def test_limits_hold_across_worker_processes(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    conn.execute(
        "CREATE TABLE spans (job_id bigint PRIMARY KEY, group_key text,"
        " started_at timestamptz NOT NULL, ended_at timestamptz)"
    )
    rota.set_limit(conn, "limited.span", concurrency=3, group_concurrency=1)
    rota.enqueue_many(
        conn,
        [rota.NewJob("limited.span", {"seconds": 0.05}, group=f"g{n % 4}") for n in range(JOBS)],
    )
    workers = [
        WorkerProcess(
            db_url,
            "--types",
            "limited.span",
            "--concurrency",
            "4",
            "--poll-interval",
            "0.2",
            log=tmp_path / f"w{i}.log",
        )
        for i in range(3)
    ]
    done = "SELECT count(*) AS n FROM rota.job WHERE status = 'done'"
    wait_for(lambda: conn.execute(done).fetchone()["n"] == JOBS, 120, "every job done")  # type: ignore[index]
    for worker in workers:
        assert worker.stop() == 0, worker.output()
    assert most_at_once(conn, by_group=False) <= 3  # 12 slots in all, 3 allowed
    assert most_at_once(conn, by_group=True) == 1
    attempts = conn.execute("SELECT DISTINCT attempts FROM rota.job").fetchall()
    assert attempts == [{"attempts": 1}]  # held back jobs were never counted as attempts
