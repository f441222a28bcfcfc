"""Exactly-once database effects for at-least-once jobs.

A job may run more than once (a lost lease, a crash after the effect but before
completion). Two ways to keep its database effects single:

1. Complete in your own transaction: write the effect and call
   `rota.complete(conn, job)` in the same transaction. If the lease was lost,
   `complete` returns False: roll back, and the effect never happened.
2. Effect markers: `record_effect(conn, job, "charge")` in the effect's
   transaction returns False when a previous attempt already recorded it, so
   the rerun skips the effect.

For effects outside the database, pass `job.effect_key` as the idempotency key
of the external call: it is the same on every attempt.
"""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from rota import limits, sql
from rota.db import Conn, fetch_all
from rota.errors import InvalidInput
from rota.jobs import Job


def record_effect(conn: Conn, job: Job, effect: str, result: Any = None) -> bool:
    """Record that `effect` of `job` happened; False if it was recorded before.

    `result` is stored as JSON under the limits of a handler's result."""
    key = _key(job, effect)
    encoded = limits.encode_value(result, "the effect's result")
    rows = fetch_all(
        conn,
        sql.query("record_effect"),
        {"key": key, "effect": effect, "result": Jsonb(result, dumps=lambda _: encoded)},
    )
    return bool(rows)


def effect_result(conn: Conn, job: Job, effect: str) -> Any:
    """The result stored with an effect, or None when it has not happened."""
    rows = fetch_all(conn, sql.query("get_effect"), {"key": _key(job, effect), "effect": effect})
    return rows[0]["result"] if rows else None


def _key(job: Job, effect: str) -> str:
    """The job's effect key, once the job and the effect's name are checked."""
    if not isinstance(job, Job):
        raise InvalidInput(f"effects are kept per job: give a Job, not {type(job).__name__}")
    limits.name(effect, "effect")
    return job.effect_key
