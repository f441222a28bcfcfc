"""How many rows of rota.job a transaction has read so far, for tests that a
statement reads only what it needs (PostgreSQL's own count, not a timing)."""

from __future__ import annotations

from typing import Any

import psycopg


def rows_read(conn: psycopg.Connection[Any]) -> int:
    """Rows of rota.job read in `conn`'s current transaction: sequentially, or
    fetched through an index."""
    row = conn.execute(
        "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0)"
        " FROM pg_stat_xact_user_tables WHERE relid = 'rota.job'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])
