"""Rows archived before migration 0039 gave the archive its status check: the check
was added `NOT VALID`, so such a row may hold a status no reader knows."""

from __future__ import annotations

from typing import Any

STATUSES = "'ready', 'running', 'waiting', 'done', 'failed', 'dead', 'cancelled'"
"""The statuses of `job_archive_status_check`."""


def archive_as_before_the_check(conn: Any, status: str, job_ids: list[int]) -> None:
    """Move these jobs to the archive in `status`, as a row older than the check
    could hold it: the check dropped, the rows moved, the check added back as
    migration 0039 adds it (`NOT VALID`). An autocommit connection, as its owner."""
    conn.execute("ALTER TABLE rota.job_archive DROP CONSTRAINT job_archive_status_check")
    conn.execute(
        "INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts,"
        " max_attempts, created_at, finished_at, archived_at, priority, releases, parent_id)"
        " SELECT id, type, payload, %s, run_at, 1, max_attempts, created_at, now(), now(),"
        " priority, 0, parent_id FROM rota.job WHERE id = ANY(%s)",
        (status, job_ids),
    )
    conn.execute("DELETE FROM rota.job WHERE id = ANY(%s)", (job_ids,))
    conn.execute(
        "ALTER TABLE rota.job_archive ADD CONSTRAINT job_archive_status_check"
        f" CHECK (status IN ({STATUSES})) NOT VALID"
    )
