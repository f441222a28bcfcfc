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

    The claims of the two lanes and the probe of the heartbeat thread share
    one Floor: a claim raises a priority's start only if it was sent after the
    probe last lowered it (else it may have walked past the job found).
    """

    MARGIN = timedelta(seconds=0.1)
    PROBE_SECONDS = 1.0

    def __init__(self, types: Sequence[str] | None = None) -> None:
        self.types = None if types is None else tuple(types)
        self._since: list[datetime | None] = [None] * PRIORITIES
        self._lowered: list[int] = [0] * PRIORITIES
        self._generation = 0
        self._limited: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def bounds(self) -> tuple[list[datetime | None], int]:
        """Each priority's start, and the generation a claim sent with it carries."""
        with self._lock:
            return list(self._since), self._generation

    def claimed(self, jobs: Sequence[Job], generation: int) -> None:
        """A claim sent at `generation` took `jobs`, in the order they start (as `claim`
        returns them): their priorities start behind the last of them from now on.
        Jobs of limited types are picked apart from the walk (rota.pick_limited)
        and move nothing."""
        with self._lock:
            limited = self._limited
            # In start order, the last job of a priority has its latest run_at.
            last = {job.priority: job.run_at for job in jobs if job.type not in limited}
            for p, run_at in last.items():
                if generation < self._lowered[p]:
                    continue
                start = run_at - self.MARGIN
                since = self._since[p]
                if since is None or start > since:
                    self._since[p] = start

    def probe(self, conn: Conn, now: datetime | None = None) -> list[int]:
        """Move back each priority's start to its first ready job; the priorities moved."""
        with self._lock:
            if all(since is None for since in self._since):
                return []  # every claim walks from the first: nothing to move
        with errors_wrapped(), conn.cursor(row_factory=tuple_row) as cur:
            limited = frozenset(row[0] for row in cur.execute(sql.query("limited_types")))
            cur.execute(_floor_statement(self.types), {"types": None, "now": now})
            firsts = cur.fetchall()
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
        return moved


@functools.lru_cache(maxsize=64)
def _floor_statement(types: tuple[str, ...] | None) -> LiteralString:
    return with_types(sql.query("claim_floor"), types)
