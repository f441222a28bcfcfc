"""Where a worker's claims start their walk of the claim index, per priority.

The claims of a worker (`rota.claim.claim`, `write_and_claim`) take a start per
priority; this module keeps it, raised by each claim and lowered by a probe
(run by the worker's floor probe every `Floor.PROBE_SECONDS`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import LiteralString

from psycopg.rows import tuple_row

from rota import sql
from rota.claim import with_types
from rota.db import Conn, errors_wrapped
from rota.jobs import Job

PRIORITIES = 10
"""Priorities 0 (first) to 9, as DESIGN fixes them."""


class Floor:
    """Where a worker's claims start their walk of the claim index, per priority.

    The claim walks `job_claim_idx` in (priority, run_at, id) order. Every job
    claimed leaves an index entry behind its ready version; once no snapshot can
    see that version, the first scan to meet it marks it dead and the next ones
    skip it. A transaction held open anywhere in the database (a report, a
    `pg_dump`, a session left idle in transaction) keeps every such version
    visible, and each claim walks all the entries of the jobs claimed since it
    began: a claim of 0.7 ms took 58 ms after three minutes of 1,000 jobs/s.

    So each claim starts where the worker's last one ended at that priority,
    less `MARGIN` for an enqueue that committed after jobs queued behind it
    were claimed. A job can still become ready behind that point: a paused
    type resumed, a claim rolled back, a run_at given in the past, a job
    skipped while another transaction held its row. `probe` finds the first
    ready job of each priority (the heartbeat thread runs it every
    `PROBE_SECONDS`) and moves the start back to it, so such a job waits at
    most that long behind a busy queue; with the queue idle it waits for the
    next claim, as before.

    Limited types are picked apart from that walk (`rota.pick_limited`), from
    `job_group_ready_idx`, where a type's jobs without a group are one range
    per priority: each limited type has starts of its own for that range,
    raised by the last of its jobs without a group that a claim took and
    lowered by the same probe. A job a limit holds back is ready after the
    last one picked, so it is never behind the start; jobs of named groups are
    walked from the first entry, as before.

    The claims of the two lanes and the probe of the heartbeat thread share
    one Floor: a claim raises a start only if it was sent after the probe last
    lowered it (else it may have walked past the job found).
    """

    MARGIN = timedelta(seconds=0.1)
    PROBE_SECONDS = 1.0

    def __init__(self, types: Sequence[str] | None = None) -> None:
        self.types = None if types is None else tuple(types)
        self._since: list[datetime | None] = [None] * PRIORITIES
        self._lowered: list[int] = [0] * PRIORITIES
        self._limited_since: dict[str, list[datetime | None]] = {}
        """Each limited type's starts for its jobs without a group, per priority."""
        self._limited_lowered: dict[tuple[str, int], int] = {}
        self._generation = 0
        self._limited: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def bounds(self) -> tuple[list[datetime | None], dict[str, list[datetime | None]], int]:
        """Each priority's start, each limited type's starts, and the generation a
        claim sent with them carries."""
        with self._lock:
            limited = {t: list(starts) for t, starts in self._limited_since.items()}
            return list(self._since), limited, self._generation

    def claimed(self, jobs: Sequence[Job], generation: int) -> None:
        """A claim sent at `generation` took `jobs`, in the order they start (as `claim`
        returns them): their priorities start behind the last of them from now on.
        Jobs of limited types are picked apart from the walk (rota.pick_limited)
        and move their type's starts only, those without a group."""
        with self._lock:
            limited = self._limited
            # In start order, the last job of a priority has its latest run_at.
            last = {job.priority: job.run_at for job in jobs if job.type not in limited}
            for p, run_at in last.items():
                if generation < self._lowered[p]:
                    continue
                self._since[p] = _raised(self._since[p], run_at - self.MARGIN)
            # Picked in run_at order within a type and priority: the latest is the last.
            latest: dict[tuple[str, int], datetime] = {}
            for job in jobs:
                if job.type in limited and job.group_key is None:
                    key = (job.type, job.priority)
                    latest[key] = max(job.run_at, latest.get(key, job.run_at))
            for (job_type, p), run_at in latest.items():
                if generation < self._limited_lowered.get((job_type, p), 0):
                    continue
                starts = self._limited_since.setdefault(job_type, [None] * PRIORITIES)
                starts[p] = _raised(starts[p], run_at - self.MARGIN)

    def probe(self, conn: Conn, now: datetime | None = None) -> list[int]:
        """Move back each start (the walk's, each limited type's) to its first ready
        job; the priorities moved. Learns which types are limited."""
        with self._lock:
            walk = any(since is not None for since in self._since)
            picks = bool(self._limited_since)
        with errors_wrapped(), conn.cursor(row_factory=tuple_row) as cur:
            limited = frozenset(row[0] for row in cur.execute(sql.query("limited_types")))
            firsts = firsts_limited = []
            if walk:  # else every claim walks from the first: nothing to move
                cur.execute(_floor_statement(self.types), {"types": None, "now": now})
                firsts = cur.fetchall()
            if picks:
                cur.execute(_limited_floor_statement(self.types), {"types": None, "now": now})
                firsts_limited = cur.fetchall()
        moved = []
        with self._lock:
            self._limited = limited
            for priority, run_at in firsts:
                since = self._since[priority]
                if run_at is not None and since is not None and run_at < since:
                    self._generation += 1
                    self._lowered[priority] = self._generation
                    self._since[priority] = run_at
                    moved.append(priority)
            # A type no longer limited is walked with the others; limited again
            # later, its picks start from the first.
            for job_type in self._limited_since.keys() - limited:
                del self._limited_since[job_type]
            for job_type, priority, run_at in firsts_limited:
                starts = self._limited_since.get(job_type)
                if (
                    starts is not None
                    and starts[priority] is not None
                    and run_at < starts[priority]
                ):
                    self._generation += 1
                    self._limited_lowered[(job_type, priority)] = self._generation
                    starts[priority] = run_at
                    moved.append(priority)
        return moved


def _raised(since: datetime | None, start: datetime) -> datetime:
    return start if since is None or start > since else since


@functools.lru_cache(maxsize=64)
def _floor_statement(types: tuple[str, ...] | None) -> LiteralString:
    return with_types(sql.query("claim_floor"), types)


@functools.lru_cache(maxsize=64)
def _limited_floor_statement(types: tuple[str, ...] | None) -> LiteralString:
    return with_types(sql.query("limited_floor"), types)
