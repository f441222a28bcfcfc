"""Rows a worker cannot read, written around every check of the database, claimed
by real `rota worker` processes beside ordinary jobs: each goes dead at once with
"unreadable row: ...", charged to that row only; no worker exits and no other job
loses an attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

import rota
from tests.acceptance.procs import WorkerProcess, wait_for

HOSTILE = {
    "payload nested 5,000 deep": (
        "payload = (repeat('[', 5000) || repeat(']', 5000))::jsonb",
        "payload: RecursionError",
    ),
    "created_at infinity": ("created_at = 'infinity'", "created_at: DataError"),
    "created_at in year 20000": ("created_at = '20000-01-01 00:00+00'", "created_at: DataError"),
}
"""How each row is spoiled (a plain UPDATE), and how its error begins after
"unreadable row: "."""


def _around_every_check(conn: psycopg.Connection[Any]) -> None:
    """This test database only: no CHECK on rota.job, no trigger fires (a migration
    script or a hand fix run as the owner, or a row older than a check)."""
    names = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'rota.job'::regclass AND contype = 'c'"
    ).fetchall()
    for (name,) in (tuple(row.values()) for row in names):
        conn.execute(
            pgsql.SQL("ALTER TABLE rota.job DROP CONSTRAINT {}").format(pgsql.Identifier(name))
        )
    conn.execute("SET session_replication_role = replica")


def test_unreadable_rows_go_dead_and_cost_their_neighbours_nothing(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    _around_every_check(conn)
    ordinary = rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(60)])
    bad: dict[int, str] = {}
    for what, (change, _) in HOSTILE.items():
        for _ in range(2):
            job_id = rota.enqueue(conn, "noop")
            conn.execute(
                pgsql.SQL("UPDATE rota.job SET {} WHERE id = %s").format(pgsql.SQL(change)),
                (job_id,),
            )
            bad[job_id] = what
    workers = [
        WorkerProcess(db_url, "--concurrency", "8", log=tmp_path / f"w{i}.log") for i in range(2)
    ]
    try:
        settled = "SELECT count(*) AS n FROM rota.job WHERE status IN ('done', 'dead')"
        total = len(ordinary) + len(bad)
        wait_for(lambda: conn.execute(settled).fetchone()["n"] == total, 60, "every job settled")
        assert [w.proc.poll() for w in workers] == [None, None]  # no worker exited
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0]
    rows = {
        r["id"]: r
        for r in conn.execute("SELECT id, status, attempts, last_error FROM rota.job").fetchall()
    }
    assert {(rows[i]["status"], rows[i]["attempts"]) for i in ordinary} == {("done", 1)}
    for job_id, what in bad.items():
        row = rows[job_id]
        assert (row["status"], row["attempts"]) == ("dead", 1), (what, row)
        assert row["last_error"].startswith(f"unreadable row: {HOSTILE[what][1]}"), row
