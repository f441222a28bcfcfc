"""A model of one worker against a real PostgreSQL: hypothesis drives the worker's
real parts (the claim loop's claim step, the slots, the outcome buffer, the
production lease renewal stepped without its thread, the attempts' handlers as
tasks) through interleavings chosen step by step, and checks after every step
what the worker promises. Every event of `rota_worker.attempts` is driven:
started, finished, timeout, cancel, lease lost, shutdown, no slot, unreadable,
written, given back, lost.

Injected: fast and slow attempts, jobs claimed ahead and given back (and claimed
again in the statement that gave them back), claims whose answer is lost or that
never reach the database, leases stolen by a reaper and another worker, cancel
requests, timeouts, renewals that fail, outcome writes that fail, handlers
raising errors, CancelledError or a BaseException, rows the worker cannot read.

Invariants after every step:
- an attempt whose handler runs is held (its record, by identity) and takes a
  slot, and unless its lease was stolen, the database says it is running under
  this worker at that attempt; a renewal renews it; after a renewal, no handler
  with a stolen lease runs;
- the slots taken are the records whose handler has not ended, never more than
  the concurrency;
- a row the worker cannot read never starts, and ends dead, "unreadable row";
- no two attempts of one job run at once holding a lease;
- nothing is written for an attempt not held: a row another worker holds is
  never touched, every settled outcome was held until settled;
- attempts are counted as DESIGN.md section 3 says: every claim counts one, every
  give-back (a release: claimed ahead too long, a lost claim's jobs, shutdown)
  takes it back, an outage never counts.

`make test` runs a few examples; `make soak` many (ROTA_MODEL_EXAMPLES).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import dict_row

import rota
from rota import claim as claims
from rota import db
from rota.attempt import Attempt
from rota.errors import DatabaseUnavailable
from rota.handlers import Handler
from rota.jobs import Job, Outcome
from rota_worker.attempts import HELD, SLOTTED, Event, Execution, State
from rota_worker.lanes import Lane
from rota_worker.link import Link
from rota_worker.lost_claims import Recovery
from rota_worker.settings import WorkerSettings
from rota_worker.slots import AHEAD_MAX_WAIT_SECONDS
from rota_worker.worker import Worker

EXAMPLES = int(os.environ.get("ROTA_MODEL_EXAMPLES", "8"))
STEPS = int(os.environ.get("ROTA_MODEL_STEPS", "40"))
CONCURRENCY = 2
THIEF = "thief"
UNDECODABLE = os.fsdecode(b"report-\xff.csv") + "\x00"


class Boom(BaseException):
    """A handler's own BaseException."""


class InjectedLink(Link):
    """A worker connection whose next call can fail as an outage, before the
    statement is sent or after it committed (its answer lost); calls run in the
    event loop's thread, so each step is deterministic. What each call really did
    to the database is reported to `observe`."""

    def __init__(self, dsn: str, observe: Callable[[Any, tuple[Any, ...], Any], None]) -> None:
        super().__init__(dsn, "model", io=None)  # type: ignore[arg-type]
        self.observe = observe
        self.next_call = "ok"

    async def run(self, fn: Any, *args: Any) -> Any:
        mode, self.next_call = self.next_call, "ok"
        if mode == "not sent":
            raise DatabaseUnavailable("database unavailable: injected before sending")
        result = self._call(fn, args)
        self.observe(fn, args, result)
        if mode == "answer lost":
            self.close()
            raise DatabaseUnavailable("database unavailable: injected, the answer was lost")
        return result


class WorkerModel(RuleBasedStateMachine):
    dsn: str

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row)
        self.conn.execute("TRUNCATE rota.job RESTART IDENTITY CASCADE")
        self.now = 0.0
        """The model's clock for the waits of jobs claimed ahead."""
        self.loop = asyncio.new_event_loop()
        self.control: dict[int, asyncio.Future[str]] = {}
        self.claimed: Counter[int] = Counter()
        self.released: Counter[int] = Counter()
        self.stolen: set[tuple[int, int]] = set()
        self.thief: dict[int, int] = {}
        self.records: list[Execution] = []
        handler = Handler("m", self._handler, is_async=True, wants_context=False)
        self.worker = Worker(
            self.dsn,
            WorkerSettings(
                concurrency=CONCURRENCY, lease_seconds=600, run_reaper=False, run_scheduler=False
            ),
            handlers={"m": handler},
        )
        self.link = InjectedLink(self.dsn, self._observe)
        self.claims = self.worker.claims
        self.claims._lead = Lane(self.link, lead=True)
        self.claims._lanes = [self.claims._lead]
        self.claims._wait_after = self._no_wait  # type: ignore[method-assign]
        self.worker.slots.clock = lambda: self.now
        attempts = self.worker.attempts
        real_claimed, real_settled = attempts.claimed, attempts.settled

        def claimed(job: Job, timeout: float | None, now: float) -> Execution:
            record = real_claimed(job, timeout, now)
            self.records.append(record)
            return record

        def settled(record: Execution) -> None:
            assert record.state not in HELD and record not in attempts
            self.settled.append(record)
            real_settled(record)

        attempts.claimed = claimed  # type: ignore[method-assign]
        attempts.settled = settled
        self.settled: list[Execution] = []
        self.unreadable: set[int] = set()
        self.renewal_fails = False
        self.renewal = self.worker.leases
        self.renewal.loop = self.loop
        real_connect = self.renewal._connect
        assert real_connect is not None

        def connect() -> db.Conn:
            if self.renewal_fails:
                raise DatabaseUnavailable("database unavailable: injected under the renewal")
            return real_connect()

        self.renewal._connect = connect

    async def _no_wait(self, *_: Any) -> None:
        return None

    async def _handler(self, job: Job) -> None:
        future = self.loop.create_future()
        self.control[id(job)] = future
        how = await future
        if how == "error":
            raise ValueError(f"cannot read {UNDECODABLE}")
        if how == "cancels itself":
            raise asyncio.CancelledError()
        if how == "base exception":
            raise Boom("out of the blue")

    def _observe(self, fn: Any, args: tuple[Any, ...], result: Any) -> None:
        """What a call really did: the claims and the releases written."""
        name = getattr(fn, "__name__", "")
        if name in ("write_and_claim", "_claim_when_notified"):
            written, jobs = result
            self.claimed.update(job.id for job in jobs)
            if name == "write_and_claim":
                self._releases(args[1], written)
        elif name == "write_outcomes":
            self._releases(args[1], result)

    def _releases(self, batch: list[Attempt], written: dict[tuple[int, int], Any]) -> None:
        for attempt in batch:
            if attempt.outcome is Outcome.RELEASED and attempt.key in written:
                self.released[attempt.job_id] += 1

    def _turn(self, coro: Any = None) -> Any:
        """Run `coro` (if any), then let the tasks started take their steps."""

        async def step() -> Any:
            result = await coro if coro is not None else None
            for _ in range(5):
                await asyncio.sleep(0)
            return result

        return self.loop.run_until_complete(step())

    def _live(self) -> list[Execution]:
        return [e for e in self.records if e.task is not None and not e.task.done()]

    def _in_handler(self) -> list[Execution]:
        return [e for e in self._live() if id(e.job) in self.control]

    def teardown(self) -> None:
        for execution in self._live():
            execution.stop(Event.SHUTDOWN)
        self._turn()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()

        async def drain() -> None:
            await asyncio.gather(*pending, return_exceptions=True)

        self.loop.run_until_complete(drain())
        self.link.close()
        self.renewal.close()
        self.loop.close()
        self.conn.close()

    # -- rules -------------------------------------------------------------------
    @rule(n=st.integers(1, 3))
    def enqueue(self, n: int) -> None:
        rota.enqueue_many(self.conn, [rota.NewJob("m") for _ in range(n)])

    @rule()
    def enqueue_a_full_batch_ahead(self) -> None:
        """As many jobs as a claim ahead takes: its lane's next claim carries outcomes
        (a job given back meanwhile can come back in that very statement)."""
        self.worker.slots.fast_in_a_row = CONCURRENCY
        n = self.claims.free_slots()
        if n > 0:
            rota.enqueue_many(self.conn, [rota.NewJob("m") for _ in range(n)])

    @precondition(lambda self: self.claims.lost_claim.state is Recovery.NONE)
    @rule(mode=st.sampled_from(["ok", "ok", "answer lost", "not sent"]), ahead=st.booleans())
    def claim(self, mode: str, ahead: bool) -> None:
        """One claim step of the claim loop (claiming ahead: after fast attempts)."""
        self.worker.slots.fast_in_a_row = CONCURRENCY if ahead else 0
        free = self.claims.free_slots()
        if free <= 0:
            return
        self.claims.jobs_notified.set()  # an idle claim's NOTIFY has come
        self.link.next_call = mode
        self._turn(self.claims._claim(self.claims._lead, free))

    @precondition(lambda self: self.claims.lost_claim.state is Recovery.LOST)
    @rule(mode=st.sampled_from(["ok", "not sent"]))
    def give_back_lost_claim(self, mode: str) -> None:
        self.link.next_call = mode
        try:
            self._turn(self.claims.lost_claim.give_back(self.link))
        except DatabaseUnavailable:
            assert self.claims.lost_claim.state is Recovery.LOST

    @rule(then_claim=st.booleans())
    def waited_too_long(self, then_claim: bool) -> None:
        """Jobs claimed ahead waited past AHEAD_MAX_WAIT_SECONDS: given back, by the
        buffer or (`then_claim`) by the lane's next claim, which may take them again."""
        self.now += AHEAD_MAX_WAIT_SECONDS
        self.worker.slots.give_back_stale()
        self._turn()
        if then_claim and self.claims.lost_claim.state is Recovery.NONE:
            self.claim("ok", ahead=True)

    @precondition(lambda self: bool(self._in_handler()))
    @rule(
        data=st.data(),
        how=st.sampled_from(["done", "done", "error", "cancels itself", "base exception"]),
    )
    def handler_ends(self, data: st.DataObject, how: str) -> None:
        execution = data.draw(st.sampled_from(self._in_handler()))
        self.control[id(execution.job)].set_result(how)
        self._turn()

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), why=st.sampled_from([Event.TIMEOUT, Event.SHUTDOWN]))
    def stopped(self, data: st.DataObject, why: Event) -> None:
        data.draw(st.sampled_from(self._live())).stop(why)
        self._turn()

    @precondition(lambda self: bool(self._held_in_database()))
    @rule(data=st.data())
    def lease_stolen(self, data: st.DataObject) -> None:
        """The lease expired (no heartbeat reached the database for a lease), a reaper
        gave the job back and another worker claimed it."""
        job_id, attempt = data.draw(st.sampled_from(sorted(self._held_in_database())))
        self.conn.execute(
            "UPDATE rota.job SET attempts = attempts + 1, claims = claims + 1, locked_by = %s,"
            " locked_until = now() + interval '1 hour' WHERE id = %s",
            (THIEF, job_id),
        )
        self.claimed[job_id] += 1
        self.stolen.add((job_id, attempt))
        self.thief[job_id] = attempt + 1

    def _held_in_database(self) -> set[tuple[int, int]]:
        rows = self.conn.execute(
            "SELECT id, claims FROM rota.job WHERE status = 'running' AND locked_by = %s",
            (self.worker.worker_id,),
        ).fetchall()
        return {(r["id"], r["claims"]) for r in rows}

    @precondition(lambda self: bool(self.thief))
    @rule(data=st.data())
    def thief_finishes(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.thief)))
        attempt = self.thief.pop(job_id)
        claims.write_outcomes(
            self.conn, THIEF, [Attempt(job_id, attempt, Outcome.DONE, claim=attempt)]
        )

    @precondition(lambda self: bool(self.worker.attempts.snapshot()))
    @rule(data=st.data())
    def cancel_requested(self, data: st.DataObject) -> None:
        execution = data.draw(st.sampled_from(self.worker.attempts.snapshot()))
        rota.cancel(self.conn, [execution.job.id])

    @rule()
    def enqueue_an_unreadable_row(self) -> None:
        """A payload nested deeper than Python's recursion limit, written around any
        check (the table's triggers off for this write): claimed beside ordinary jobs,
        it must cost them nothing."""
        job_id = rota.enqueue(self.conn, "m")
        self.conn.execute("SET session_replication_role = replica")
        self.conn.execute(
            "UPDATE rota.job SET payload = (repeat('[', 5000) || repeat(']', 5000))::jsonb"
            " WHERE id = %s",
            (job_id,),
        )
        self.conn.execute("RESET session_replication_role")
        self.unreadable.add(job_id)

    @rule(fails=st.booleans())
    def heartbeat(self, fails: bool) -> None:
        """One round of the production lease renewal (its thread's `step`)."""
        before = {e.key for e in self._live() if e.key not in self.stolen and e.stopped is None}
        self.renewal_fails = fails
        if fails:
            self.renewal.close()
        self.renewal.step()
        self._turn()
        if fails:
            return
        renewed = self.conn.execute(
            "SELECT id, claims FROM rota.job WHERE locked_until > now() + interval '500 s'"
            " AND locked_by = %s",
            (self.worker.worker_id,),
        ).fetchall()
        assert before <= {(r["id"], r["claims"]) for r in renewed}
        assert not [e for e in self._live() if e.key in self.stolen], "a stolen attempt runs on"

    @precondition(lambda self: bool(self.worker.outcomes.pending))
    @rule(mode=st.sampled_from(["ok", "ok", "not sent", "answer lost"]))
    def outcomes_written(self, mode: str) -> None:
        self.link.next_call = mode
        with contextlib.suppress(DatabaseUnavailable):
            self._turn(self.worker.outcomes.flush(self.link))

    # -- invariants --------------------------------------------------------------
    @invariant()
    def a_running_handler_is_held_and_leased(self) -> None:
        held = self.worker.attempts.snapshot()
        rows = {
            r["id"]: r
            for r in self.conn.execute(
                "SELECT id, status, locked_by, attempts, claims FROM rota.job"
            ).fetchall()
        }
        for execution in self._live():
            assert any(e is execution for e in held), f"{execution.key} runs unheld"
            assert execution.state in SLOTTED
            if execution.key in self.stolen:
                continue
            row = rows[execution.job.id]
            assert (row["status"], row["locked_by"], row["claims"]) == (
                "running",
                self.worker.worker_id,
                execution.key[1],
            ), f"{execution.key} runs without its lease: {row}"

    @invariant()
    def no_two_attempts_of_a_job_run_at_once(self) -> None:
        leased = [e.job.id for e in self._live() if e.key not in self.stolen]
        leased += list(self.thief)
        assert len(leased) == len(set(leased)), leased

    @invariant()
    def records_are_in_their_states(self) -> None:
        held = {id(e) for e in self.worker.attempts.snapshot()}
        for execution in self.records:
            assert (execution.state in HELD) == (id(execution) in held), execution

    @invariant()
    def the_slots_taken_are_the_handlers_not_ended(self) -> None:
        attempts = self.worker.attempts
        slotted = [e for e in self.records if e.state in SLOTTED]
        assert attempts.slots_taken == len(slotted) <= CONCURRENCY
        assert {id(e) for e in self._live()} <= {id(e) for e in slotted}

    @invariant()
    def an_unreadable_row_never_starts_and_ends_dead(self) -> None:
        for execution in self.records:
            if execution.job.id in self.unreadable:
                assert execution.task is None, execution.key
        for execution in self.settled:
            if execution.job.id in self.unreadable and execution.state is State.WRITTEN:
                row = self.conn.execute(
                    "SELECT status, last_error FROM rota.job WHERE id = %s", (execution.job.id,)
                ).fetchone()
                assert row["status"] == "dead", row
                assert row["last_error"].startswith("unreadable row: "), row

    @invariant()
    def nothing_written_for_an_attempt_not_held(self) -> None:
        for job_id, attempt in self.thief.items():
            row = self.conn.execute(
                "SELECT status, locked_by, attempts FROM rota.job WHERE id = %s", (job_id,)
            ).fetchone()
            assert row == {"status": "running", "locked_by": THIEF, "attempts": attempt}

    @invariant()
    def attempts_are_counted_as_designed(self) -> None:
        for row in self.conn.execute("SELECT id, attempts FROM rota.job").fetchall():
            expected = self.claimed[row["id"]] - self.released[row["id"]]
            assert row["attempts"] == expected, (row, expected)


@pytest.mark.timeout(max(300, EXAMPLES * 30))
def test_the_worker_model(db_url: str) -> None:
    WorkerModel.dsn = db_url
    run_state_machine_as_test(
        WorkerModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=os.environ.get("ROTA_MODEL_RANDOM") is None,
            database=None,
        ),
    )
