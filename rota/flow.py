"""Limits per job type that bind every worker at once: concurrency, per-group
concurrency and a rate of starts.

Limits live in the database (rota.job_limit) and the claim reads them in the
statement that claims (rota.pick_limited, migrations 0013-0021), so a limit holds
however many workers claim, and survives restarts of every process. A job held
back by a limit stays ready with its attempts untouched and starts as soon as
the limit allows: the outcome that frees a slot wakes idle workers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.pq import TransactionStatus

from rota import limits, sql
from rota.db import ConnOrDsn, connection, fetch_all
from rota.errors import InvalidInput


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """The limits of one job type, and what they hold back now."""

    type: str
    concurrency: int | None = None
    """At most this many jobs of the type running at once, across all workers."""
    group_concurrency: int | None = None
    """At most this many running at once per group of the type."""
    rate: int | None = None
    """At most `rate` starts in any `per` seconds."""
    per: float | None = None
    due: int = 0
    """Ready jobs of the type whose run_at has come."""
    running: int = 0
    recent_starts: int = 0
    """Starts counted in the current rate window (0 without a rate)."""
    held: int = 0
    """Due jobs no claim may take now: the limit holds them back."""

    @property
    def limited(self) -> bool:
        return self.held > 0

    def describe(self) -> str:
        """`concurrency 5, per group 1, 100 per 60s`: the limit in one line."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.group_concurrency is not None:
            parts.append(f"per group {self.group_concurrency}")
        if self.rate is not None and self.per is not None:
            parts.append(f"{self.rate} per {self.per:g}s")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["limited"] = self.limited
        return data


def set_limit(
    conn_or_dsn: ConnOrDsn,
    type: str,
    concurrency: int | None = None,
    group_concurrency: int | None = None,
    rate: int | None = None,
    per: float | None = None,
    now: datetime | None = None,
) -> None:
    """Set the limits of a job type, replacing those it had.

    Give at least one of `concurrency`, `group_concurrency` and `rate` (with
    `per`, in seconds). Jobs running when a limit is set keep running; the
    limit binds every claim that starts after it is committed.
    """
    params = {
        "type": _job_type(type),
        "concurrency": limits.limit_count(concurrency, "concurrency"),
        "group_concurrency": limits.limit_count(group_concurrency, "group_concurrency"),
        "rate": limits.limit_count(rate, "rate", limits.MAX_RATE),
        "per": None if per is None else limits.interval_seconds(per, "per"),
        "now": limits.clock(now),
    }
    if (rate is None) != (per is None):
        raise InvalidInput("give rate and per together: at most RATE starts per PER seconds")
    if concurrency is None and group_concurrency is None and rate is None:
        raise InvalidInput(
            "give a limit: concurrency, group_concurrency, or rate with per"
            " (rota.clear_limit removes a type's limits)"
        )
    with connection(conn_or_dsn) as conn:
        fetch_all(conn, sql.query("limit_set"), params)
        if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            # Committed: settle the limit now, so that the next claims take its
            # slots (inside a caller's transaction the first claims after it
            # commits settle it).
            fetch_all(conn, sql.query("limit_settle"), {"type": params["type"]})


def clear_limit(conn_or_dsn: ConnOrDsn, type: str) -> bool:
    """Remove every limit of a job type; False when it had none. ('*' too: a row
    of that name written by SQL before the database refused it.)"""
    checked = limits.name(type, "job type")
    with connection(conn_or_dsn) as conn:
        return bool(fetch_all(conn, sql.query("limit_clear"), {"type": checked}))


def list_limits(
    conn_or_dsn: ConnOrDsn, now: datetime | None = None, types: Sequence[str] | None = None
) -> list[Limit]:
    """Every type's limits (only those of `types` when given), with how many due
    jobs each holds back now."""
    wanted = limits.names(types, "job types") if types is not None else None
    params = {"now": limits.clock(now), "types": wanted}
    with connection(conn_or_dsn) as conn:
        rows = fetch_all(conn, sql.query("limit_states"), params)
    return [
        Limit(
            type=r["type"],
            concurrency=r["concurrency"],
            group_concurrency=r["group_concurrency"],
            rate=r["rate"],
            per=r["per_seconds"],
            due=int(r["due"]),
            running=int(r["running"]),
            recent_starts=int(r["recent_starts"]) if r["rate"] is not None else 0,
            held=max(int(r["held"]), 0),
        )
        for r in rows
    ]


def _job_type(value: Any) -> str:
    if value == "*":
        raise InvalidInput("limits are per job type: '*' is not a job type")
    return limits.name(value, "job type")  # the rule of enqueue: the same names and words
