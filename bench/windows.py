"""`python -m bench.windows`: do limits hold for handlers, not only for claims?

Handlers note their own start and end (bench.window_handlers); real `rota worker`
processes drain a limited type; the worst window is reported:
- rate: 20 starts per second, 4 worker processes (concurrency 8): the most
  handler starts seen in any one-second window;
- concurrency 2, handlers that ignore their timeout (0.5 s, they run 2 s), 4
  worker processes in threads: the most handlers running at once;
- one worker, `--isolation process --concurrency 1`, the same handlers: the most
  children running at once.

    python -m bench.windows [--python PATH] [--rated 200] [--stubborn 12]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

import rota
from rota.testing import EmbeddedPostgres

ROOT = Path(__file__).resolve().parent.parent


def _workers(python: str, dsn: str, n: int, *flags: str) -> list[subprocess.Popen[bytes]]:
    args = [python, "-m", "rota", "worker", "--handlers", "bench.window_handlers"]
    args += ["--no-scheduler", "--lease", "10", *flags]
    env = {**os.environ, "ROTA_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)}
    return [
        subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(n)
    ]


def _drain(conn: psycopg.Connection, procs: list[subprocess.Popen[bytes]], jobs: int) -> None:
    """Wait until no job is ready or running, then stop the workers."""
    deadline = time.monotonic() + 300
    left = "SELECT count(*) FROM rota.job WHERE status IN ('ready', 'running')"
    try:
        while conn.execute(left).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise TimeoutError("the jobs were not drained within 300 s")
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)


def _runs(conn: psycopg.Connection) -> list[tuple[float, float | None]]:
    rows = conn.execute("SELECT started, ended FROM handler_run ORDER BY started").fetchall()
    conn.execute("TRUNCATE handler_run")
    return [(float(s), None if e is None else float(e)) for s, e in rows]


def most_starts_in(runs: list[tuple[float, float | None]], seconds: float) -> int:
    starts = [s for s, _ in runs]
    return max(
        (sum(1 for t in starts[i:] if t < s + seconds) for i, s in enumerate(starts)), default=0
    )


def most_at_once(runs: list[tuple[float, float | None]]) -> int:
    edges = sorted(
        [(s, 1) for s, _ in runs] + [(e if e is not None else s + 1e9, -1) for s, e in runs]
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.windows", description=__doc__)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rated", type=int, default=200)
    parser.add_argument("--stubborn", type=int, default=12)
    args = parser.parse_args(argv)
    with EmbeddedPostgres() as pg:
        dsn = pg.create_database("windows")
        rota.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE handler_run (job_id bigint, attempt int, started float8,"
                " ended float8, PRIMARY KEY (job_id, attempt))"
            )
            conn.execute("GRANT ALL ON handler_run TO PUBLIC")
            rota.set_limit(conn, "windows.rated", rate=20, per=1)
            rota.enqueue_many(conn, [rota.NewJob("windows.rated") for _ in range(args.rated)])
            _drain(conn, _workers(args.python, dsn, 4, "--concurrency", "8"), args.rated)
            rated = _runs(conn)
            stubborn = [
                rota.NewJob("windows.stubborn", {"seconds": 2}, timeout=0.5, max_attempts=1)
                for _ in range(args.stubborn)
            ]
            rota.set_limit(conn, "windows.stubborn", concurrency=2)
            rota.enqueue_many(conn, stubborn)
            _drain(conn, _workers(args.python, dsn, 4, "--concurrency", "4"), args.stubborn)
            threads = _runs(conn)
            rota.clear_limit(conn, "windows.stubborn")
            rota.enqueue_many(conn, stubborn)
            procs = _workers(args.python, dsn, 1, "--isolation", "process", "--concurrency", "1")
            _drain(conn, procs, 2 * args.stubborn)
            children = _runs(conn)
    rows = [
        ("rate 20 per 1 s, 4 workers", rated, f"{most_starts_in(rated, 1.0)} starts in 1 s"),
        ("concurrency 2, timeouts ignored, 4 workers", threads, f"{most_at_once(threads)} at once"),
        ("process isolation, concurrency 1", children, f"{most_at_once(children)} at once"),
    ]
    print("| limit | handlers | worst window seen |")
    print("|---|---:|---|")
    for what, runs, worst in rows:
        print(f"| {what} | {len(runs)} | {worst} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
