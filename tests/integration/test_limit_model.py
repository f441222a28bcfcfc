"""Claims under limits, explored by hypothesis: random enqueues, limits, claims
(alone, or two interleaved through the limit's lock), jobs started by hand,
finishes and clock steps.

After every claim the rows must show that no limit was passed by it and that
the claim did not stall: a claim that took fewer jobs than it asked for left
no job that every limit of its type would have let start.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from psycopg.rows import dict_row

import rota
from rota.claim import Attempt, claim, write_outcomes
from rota.jobs import Job, Outcome
from tests.integration.test_flow_limits import wait_for_lock_wait

TYPES = ["a", "b"]
GROUPS = [None, "g1", "g2", "g3"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class LimitedClaims(RuleBasedStateMachine):
    db_url: str

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row)
        self.now = T0
        self.limits: dict[str, dict[str, Any]] = {}
        self.starts: dict[str, list[datetime]] = {t: [] for t in TYPES}
        self.over: set[str] = set()
        """Types whose limit was tightened below what ran: not judged until they drain."""

    @initialize()
    def clean(self) -> None:
        self.conn.execute("TRUNCATE rota.job, rota.job_limit")

    def teardown(self) -> None:
        self.conn.close()

    # -- what changes the queue -------------------------------------------------

    @rule(
        job_type=st.sampled_from(TYPES),
        group=st.sampled_from(GROUPS),
        n=st.integers(1, 5),
        delay=st.sampled_from([0, 0, 30]),
    )
    def enqueue(self, job_type: str, group: str | None, n: int, delay: int) -> None:
        jobs = [rota.NewJob(job_type, group=group, delay=delay) for _ in range(n)]
        rota.enqueue_many(self.conn, jobs, now=self.now)

    @rule(
        job_type=st.sampled_from(TYPES),
        # Shares of 1 or less bind every claim; 12 and 40 leave room, which a
        # slot's bound (migration 0033) stands in for the count of.
        concurrency=st.none() | st.integers(1, 4) | st.sampled_from([12, 40]),
        group_concurrency=st.none() | st.integers(1, 3),
        rate=st.none() | st.integers(1, 6),
    )
    def set_limit(
        self,
        job_type: str,
        concurrency: int | None,
        group_concurrency: int | None,
        rate: int | None,
    ) -> None:
        if concurrency is None and group_concurrency is None and rate is None:
            rota.clear_limit(self.conn, job_type)
            self.limits.pop(job_type, None)
            return
        per = None if rate is None else 60.0
        if self.limits.get(job_type, {}).get("rate") is None:
            self.starts[job_type] = []  # a rate counts the starts since it was set
        rota.set_limit(self.conn, job_type, concurrency, group_concurrency, rate, per, now=self.now)
        self.limits[job_type] = {
            "concurrency": concurrency,
            "group": group_concurrency,
            "rate": rate,
        }
        if rate is None:
            self.starts[job_type] = []
        if self._passed(job_type, self._rows()):
            self.over.add(job_type)

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        running = [r for r in self._rows() if r["status"] == "running"]
        if not running:
            return
        done = data.draw(
            st.lists(st.sampled_from(running), max_size=4, unique_by=lambda r: r["id"])
        )
        for row in done:
            attempt = Attempt(row["id"], row["attempts"], Outcome.DONE, claim=row["claims"])
            write_outcomes(self.conn, row["locked_by"], [attempt], now=self.now)

    @rule(data=st.data(), n=st.integers(1, 8))
    def start_by_hand(self, data: st.DataObject, n: int) -> None:
        """A ready job of a limited type made running by an UPDATE written by
        hand (no claim, no slot), then a claim. The job may pass its limit; no claim may add to
        that, and the claim counts it."""
        ready = [r for r in self._rows() if r["status"] == "ready" and r["type"] in self.limits]
        if not ready:
            return
        row = data.draw(st.sampled_from(ready))
        self.conn.execute(
            "UPDATE rota.job SET status = 'running', attempts = 1, locked_by = 'hand',"
            " locked_until = %s WHERE id = %s",
            (self.now + timedelta(hours=1), row["id"]),
        )
        if self._passed(row["type"], self._rows()):
            self.over.add(row["type"])
        self.claim_alone(n=n, types=None)

    @rule(seconds=st.sampled_from([1, 20, 45]))
    def tick(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(n=st.integers(1, 8), types=st.sampled_from([None, ["a"], ["b"], ["a", "b"]]))
    def claim_alone(self, n: int, types: list[str] | None) -> None:
        jobs = claim(self.conn, "w1", n, 300, types, now=self.now)
        self._judge([(jobs, n, types)])

    @rule(first_n=st.integers(1, 6), second_n=st.integers(1, 6))
    def claim_interleaved(self, first_n: int, second_n: int) -> None:
        """The second claim starts while the first's transaction holds the limits."""
        if not self.limits:
            return
        with psycopg.connect(self.db_url) as first, psycopg.connect(self.db_url) as second:
            taken = claim(first, "w2", first_n, 300, now=self.now)
            result: list[list[Job]] = []
            waiter = threading.Thread(
                target=lambda: result.append(claim(second, "w3", second_n, 300, now=self.now))
            )
            waiter.start()
            if taken and any(j.type in self.limits for j in taken):
                # On the path of one row the second claim waits for the first's
                # locks; on slots it takes the free ones and returns.
                wait_for_lock_wait(self.db_url, unless=lambda: not waiter.is_alive())
            first.commit()
            waiter.join(timeout=60)
            second.commit()
        # Beside another, a claim on slots may take less than the limit has left
        # (the other claim's slots may hold room it did not use): never more,
        # and the next claim takes the rest.
        self._judge([(taken, first_n, None), (result[0], second_n, None)], beside=True)
        left = first_n + second_n - len(taken) - len(result[0])
        if left > 0:
            self.claim_alone(n=left, types=None)

    # -- what must hold ---------------------------------------------------------

    def _rows(self) -> list[dict[str, Any]]:
        return self.conn.execute(
            "SELECT id, type, group_key, status, run_at, attempts, claims, locked_by FROM rota.job"
        ).fetchall()

    def _window(self, job_type: str) -> list[datetime]:
        return [s for s in self.starts[job_type] if s > self.now - timedelta(seconds=60)]

    def _passed(self, job_type: str, rows: list[dict[str, Any]]) -> bool:
        limit = self.limits.get(job_type)
        if limit is None:
            return False
        running = [r for r in rows if r["type"] == job_type and r["status"] == "running"]
        by_group = Counter(r["group_key"] for r in running)
        return (limit["concurrency"] is not None and len(running) > limit["concurrency"]) or (
            limit["group"] is not None and max(by_group.values(), default=0) > limit["group"]
        )

    def _judge(
        self, claims: list[tuple[list[Job], int, list[str] | None]], beside: bool = False
    ) -> None:
        rows = self._rows()
        for job_type in list(self.over):
            if not self._passed(job_type, rows):
                self.over.discard(job_type)
        # Starts made under an earlier, higher rate may fill the window past a
        # lowered one: then no claim may add a start until the window has room.
        before = {job_type: len(self._window(job_type)) for job_type in self.limits}
        for jobs, _, _ in claims:
            for job in jobs:
                if self.limits.get(job.type, {}).get("rate") is not None:
                    self.starts[job.type].append(self.now)
        for job_type, limit in self.limits.items():
            if job_type not in self.over:
                assert not self._passed(job_type, rows), (job_type, limit)
            if limit["rate"] is not None:
                added = len(self._window(job_type)) - before[job_type]
                assert added <= max(0, limit["rate"] - before[job_type]), (job_type, limit)
        for jobs, n, types in claims:
            assert len(jobs) <= n
            if len(jobs) < n and not beside:
                for job_type in types or TYPES:
                    assert not self._claimable(job_type, rows), (job_type, self.limits)

    def _claimable(self, job_type: str, rows: list[dict[str, Any]]) -> bool:
        """A due ready job of the type that every limit would let start now."""
        due = [
            r
            for r in rows
            if r["type"] == job_type and r["status"] == "ready" and r["run_at"] <= self.now
        ]
        limit = self.limits.get(job_type)
        if not due or limit is None:
            return bool(due)
        running = [r for r in rows if r["type"] == job_type and r["status"] == "running"]
        if limit["concurrency"] is not None and len(running) >= limit["concurrency"]:
            return False
        if limit["rate"] is not None and len(self._window(job_type)) >= limit["rate"]:
            return False
        if limit["group"] is None:
            return True
        by_group = Counter(r["group_key"] for r in running)
        return any(by_group[r["group_key"]] < limit["group"] for r in due)

    @invariant()
    def each_slot_bound_holds_what_runs_in_it(self) -> None:
        """A slot's bound (migration 0033) stands for its count of running jobs
        in the claims that follow: it may be over that count, never under."""
        under = self.conn.execute(
            "SELECT ls.type, ls.slot, ls.running_at_most, count(j.id) AS running"
            " FROM rota.job_limit_slot AS ls"
            " LEFT JOIN rota.job AS j"
            "   ON j.type = ls.type AND j.limit_slot = ls.slot AND j.status = 'running'"
            " WHERE ls.running_at_most IS NOT NULL"
            " GROUP BY ls.type, ls.slot, ls.running_at_most"
            " HAVING count(j.id) > ls.running_at_most"
        ).fetchall()
        assert under == [], under

    @invariant()
    def attempts_count_claims_only(self) -> None:
        for row in self._rows():
            assert row["attempts"] == (0 if row["status"] == "ready" else 1)


def test_limited_claims(db_url: str) -> None:
    LimitedClaims.db_url = db_url
    LimitedClaims.TestCase.settings = settings(
        max_examples=int(pytest.importorskip("os").environ.get("ROTA_MODEL_EXAMPLES", "25")),
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    LimitedClaims.TestCase().runTest()


@pytest.mark.parametrize("group_concurrency", [1, None], ids=["as found", "rate alone"])
def test_a_lowered_rate_starts_nothing_until_its_window_has_room(
    db_url: str, group_concurrency: int | None
) -> None:
    """Found by the model: two starts under a rate of 2, then a rate of 1 in the
    same window. The window holds more starts than the new rate allows; the claim
    must start none, and the model must not count the earlier starts against it."""
    LimitedClaims.db_url = db_url
    state = LimitedClaims()
    try:
        state.clean()
        state.enqueue(delay=0, group=None, job_type="b", n=3)
        state.set_limit(concurrency=None, group_concurrency=None, job_type="b", rate=2)
        state.claim_alone(n=2, types=None)
        assert len(state.starts["b"]) == 2
        state.set_limit(concurrency=None, group_concurrency=group_concurrency, job_type="b", rate=1)
        state.claim_alone(n=1, types=None)
        assert len(state.starts["b"]) == 2  # nothing started under the lowered rate
        if group_concurrency is None:
            state.tick(seconds=45)
            state.tick(seconds=20)
            state.claim_alone(n=1, types=None)
            assert len(state.starts["b"]) == 3  # the window emptied: one start
    finally:
        state.teardown()
