"""The chaos soak: workers drain thousands of jobs while a chaos loop breaks things.

Several `rota worker` processes run `soak.effect` jobs, each of which writes an
effect row and completes its job in one transaction of its own. Meanwhile a
chaos loop, bounded in actions and in time, SIGKILLs workers and starts new
ones, SIGSTOPs a worker until every lease it held has been reaped and then
resumes it (a late finisher, whose completions must be refused), restarts
PostgreSQL (fast and immediate), kills reapers and schedulers (several of each
run at once), and cancels ready and running jobs; one job in 100 has a first
attempt that outlives its timeout. At the end: every job done or cancelled,
nothing running, exactly one effect per done job and none for a cancelled one,
each written by the attempt that holds the row, lease expirations counted.

`make test` runs the short plan; `make soak` runs the long one (ROTA_SOAK=full;
ROTA_SOAK_SEED replays a run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rota
from rota import control, schedule_store
from rota.errors import DatabaseUnavailable
from rota.migrate import key_index, use_key_index
from tests.acceptance.procs import wait_for
from tests.pgcluster import CrashSafePostgres
from tests.soak.harness import Fleet, Proc

TYPE = "soak.effect"
TICK = "soak/tick"
ACTIONS = ("kill", "stop", "restart-fast", "restart-immediate", "kill-service", "cancel")
TIMEOUT_EVERY = 100
"""One job in this many has a 1 s timeout that its first attempt outlives."""
CANCEL_COUNT = 20
"""Jobs a cancel action cancels, ready and running ones alike."""


@dataclasses.dataclass(frozen=True)
class Plan:
    jobs: int
    workers: int
    concurrency: int
    lease: float
    actions: tuple[str, ...]
    seconds: float
    """The chaos loop ends after this long even with actions left (the short plan
    then fails: all its actions must have happened)."""
    drain_seconds: float
    """Deadline for the last jobs once the chaos is over."""
    handler_ms: int
    """Each job's handler sleeps a random 0..handler_ms before its transaction."""


def plan_from_env(rng: random.Random) -> Plan:
    if os.environ.get("ROTA_SOAK") == "full":
        weights = {"kill": 4, "stop": 2, "restart-fast": 1, "restart-immediate": 1}
        weights.update({"kill-service": 1, "cancel": 1})
        drawn = rng.choices(list(weights), list(weights.values()), k=36)
        return Plan(
            jobs=int(os.environ.get("ROTA_SOAK_JOBS", "20000")),
            workers=5,
            concurrency=4,
            lease=3,
            actions=(*ACTIONS, *drawn),
            seconds=float(os.environ.get("ROTA_SOAK_SECONDS", "480")),
            drain_seconds=240,
            handler_ms=20,
        )
    return Plan(
        jobs=2000,
        workers=3,
        concurrency=5,
        lease=3,
        actions=(
            "kill",
            "stop",
            "restart-fast",
            "cancel",
            "kill",
            "kill-service",
            "restart-immediate",
        ),
        seconds=120,
        drain_seconds=120,
        handler_ms=10,
    )


def _columns(attempts: Iterable[tuple[Any, ...]]) -> tuple[list[Any], list[Any], list[Any]]:
    """The job ids, workers and attempt numbers of `attempts`: three arrays to unnest."""
    listed = list(attempts)
    return [a[0] for a in listed], [a[1] for a in listed], [a[2] for a in listed]


@pytest.fixture
def server() -> Iterator[CrashSafePostgres]:
    """A server of the soak's own, restarted by the chaos loop."""
    with CrashSafePostgres() as pg:
        yield pg


@pytest.fixture
def fleet(server: CrashSafePostgres, tmp_path: Path) -> Iterator[Fleet]:
    url = server.url()
    rota.migrate(url)
    # ROTA_SOAK_KEY_INDEX=partial: the same faults with idempotency keys kept
    # unique by the partial index (`rota migrate --key-index partial`).
    use_key_index(url, os.environ.get("ROTA_SOAK_KEY_INDEX") or "constraint")
    with psycopg.connect(url, autocommit=True) as conn:
        # Only the soak's own jobs: the built-in archive schedule would add one
        # at every 5-minute boundary.
        conn.execute("UPDATE rota.schedule SET suspend = true WHERE name = 'rota/archive'")
        conn.execute("CREATE TABLE soak_effect (job_id bigint, worker text, attempt int)")
        conn.execute("CREATE TABLE soak_refused (job_id bigint, worker text, attempt int)")
        conn.execute("CREATE TABLE soak_started (job_id bigint, worker text, attempt int)")
    fleet = Fleet(url, tmp_path, ROTA_SOAK_INTERRUPTED=str(tmp_path / "interrupted"))
    yield fleet
    fleet.stop_all()


class Soak:
    """The chaos loop's state and figures."""

    def __init__(self, server: CrashSafePostgres, fleet: Fleet, plan: Plan, seed: int) -> None:
        self.server = server
        self.fleet = fleet
        self.url = server.url()
        self.plan = plan
        self.rng = random.Random(seed)
        self.seed = seed
        self.enqueued: list[int] = []
        self.figures: Counter[str] = Counter(
            dict.fromkeys(("kills", "stops", "restarts", "service_kills", "cancels"), 0)
        )
        self.action_seconds: list[tuple[str, float]] = []
        self.late_by: list[tuple[Proc, list[tuple[int, str, int]]]] = []
        """The late attempts of each stopped worker, to tell which a later kill ended."""

    @property
    def late(self) -> list[tuple[int, str, int]]:
        """(job id, worker id, attempt) held by a worker when it was stopped."""
        return [attempt for _, attempts in self.late_by for attempt in attempts]

    # -- the database, through outages ---------------------------------------
    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def scalar(self, statement: str, *params: Any) -> Any:
        value = self.query(statement, *params)[0][0]
        return int(value) if isinstance(value, Decimal) else value

    def among(self, table: str, attempts: list[tuple[int, str, int]]) -> int:
        """Rows of soak table `table` (effect, refused or started) for these attempts."""
        return int(
            self.scalar(
                f"SELECT count(*) FROM {table} JOIN unnest(%s::bigint[], %s::text[], %s::int[])"
                " AS l(job_id, worker, attempt) USING (job_id, worker, attempt)",
                *_columns(attempts),
            )
        )

    def enqueue(self, count: int) -> None:
        jobs = []
        for n in range(count):
            payload = {"ms": self.rng.randint(0, self.plan.handler_ms)}
            timeout = None
            if (len(self.enqueued) + n) % TIMEOUT_EVERY == 0:
                payload["first_ms"] = 1500
                timeout = 1.0
            jobs.append(rota.NewJob(TYPE, payload, max_attempts=100, timeout=timeout))

        def attempt() -> bool:
            try:
                self.enqueued += rota.enqueue_many(self.url, jobs)
            except DatabaseUnavailable:
                return False
            return True

        wait_for(attempt, timeout=60, what=f"enqueueing {count} jobs")

    def running_by(self, proc: Proc) -> list[tuple[int, str, int]]:
        """Jobs `proc` holds and that no transaction has locked (so the reaper can take them)."""
        rows = self.query(
            "SELECT id, locked_by, attempts FROM rota.job"
            " WHERE status = 'running' AND locked_by LIKE %s FOR UPDATE SKIP LOCKED",
            proc.locked_by_pattern,
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def busy_worker(self) -> Proc:
        """A live worker holding running jobs (the busiest), once there is one."""

        def busiest() -> Proc | None:
            counts = dict(
                self.query(
                    "SELECT split_part(locked_by, ':', 2)::int, count(*) FROM rota.job"
                    " WHERE status = 'running' GROUP BY 1"
                )
            )
            procs = self.fleet.alive("worker")
            best = max(procs, key=lambda p: (counts.get(p.pid, 0), self.rng.random()))
            return best if counts.get(best.pid) else None

        found: Proc = wait_for(busiest, timeout=60, what="a worker running jobs")
        return found

    # -- actions --------------------------------------------------------------
    def start_worker(self) -> Proc:
        plan = self.plan
        return self.fleet.worker(
            "--concurrency",
            str(plan.concurrency),
            "--lease",
            str(plan.lease),
            "--poll-interval",
            "0.5",
        )

    def act(self, action: str) -> None:
        wait_for(
            lambda: self.scalar("SELECT count(*) FROM rota.job WHERE status = 'running'"),
            timeout=60,
            what=f"jobs running before {action}",
        )
        if action == "kill":
            victim = self.busy_worker()
            victim.kill()
            self.start_worker()
            self.figures["kills"] += 1
        elif action == "stop":
            # The busiest worker may end its last job between being picked and
            # being stopped (a busy machine): then pick again.
            for _ in range(20):
                if self.stop_past_lease(self.busy_worker()):
                    break
            else:
                raise AssertionError("no worker still held a job once stopped, 20 times")
        elif action.startswith("restart-"):
            self.server.stop(action.removeprefix("restart-"))
            self.server.start()
            self.figures["restarts"] += 1
            self.settle_after_restart()
        elif action == "kill-service":
            victim = self.rng.choice(self.fleet.alive("reaper") + self.fleet.alive("scheduler"))
            victim.kill()
            self.start_service(victim.name)
            self.figures["service_kills"] += 1
        elif action == "cancel":
            ids = [
                row[0]
                for status in ("ready", "running")
                for row in self.query(
                    "SELECT id FROM rota.job WHERE type = %s AND status = %s"
                    " ORDER BY random() LIMIT %s",
                    TYPE,
                    status,
                    CANCEL_COUNT // 2,
                )
            ]
            result = control.cancel(self.url, ids)
            self.figures["cancels"] += 1
            self.figures["cancelled_ready"] += len(result.ended)
            self.figures["cancel_requested_running"] += len(result.requested)
        else:  # pragma: no cover - a typo in a plan
            raise ValueError(action)

    def settle_after_restart(self) -> None:
        """Wait for the attempts that ran through a restart to end.

        A handler whose connection the restart broke gives its job back without
        trying its completion. Caught by the next action (a stop), such an attempt
        would count as a late finisher that never tried to complete."""
        through = self.query(
            "SELECT id, locked_by, attempts FROM rota.job WHERE status = 'running'"
        )

        def ended() -> bool:
            return not self.query(
                "SELECT 1 FROM rota.job j JOIN unnest(%s::bigint[], %s::text[], %s::int[])"
                " AS r(id, worker, attempt) USING (id)"
                " WHERE j.status = 'running' AND j.locked_by = r.worker AND j.attempts = r.attempt",
                *_columns(through),
            )

        wait_for(
            ended,
            timeout=self.plan.lease + 60,
            what="the attempts running through the restart to end",
        )

    def stop_past_lease(self, proc: Proc) -> bool:
        """SIGSTOP `proc` until all its leases are reaped, then let it finish late.

        False (and `proc` resumed at once) when, stopped, it held no job."""
        proc.send(signal.SIGSTOP)
        seen: set[tuple[int, str, int]] = set(self.running_by(proc))
        if not seen:
            proc.send(signal.SIGCONT)
            return False

        def reaped() -> bool:
            held = self.running_by(proc)
            seen.update(held)
            return not held

        wait_for(
            reaped,
            timeout=self.plan.lease + 60,
            what=f"the leases of stopped worker {proc.pid} to be reaped",
        )
        # A statement in flight when the signal landed may still have committed
        # for the stopped worker (its row locked, so skipped above): only the
        # attempts whose lease someone else took away are late.
        rows = self.query(
            "SELECT h.id, h.worker, h.attempt FROM unnest(%s::bigint[], %s::text[], %s::int[])"
            " AS h(id, worker, attempt) JOIN rota.job j USING (id)"
            " WHERE NOT (j.locked_by = h.worker AND j.attempts = h.attempt"
            "            AND j.status IN ('running', 'done'))",
            *_columns(seen),
        )
        late = [(r[0], r[1], r[2]) for r in rows]
        self.late_by.append((proc, late))
        proc.send(signal.SIGCONT)
        self.figures["stops"] += 1
        # Before the next fault, let each resumed handler reach its completion
        # (refused: the lease is gone) so that what it did can be checked. Jobs
        # it held claimed ahead, not started, are given back and never start.
        if late:
            wait_for(
                lambda: self.among("soak_refused", late) == self.among("soak_started", late),
                timeout=60,
                what=f"the late finisher {proc.pid} to try its started completions",
            )
        return True

    def start_service(self, name: str) -> Proc:
        if name == "reaper":
            return self.fleet.start("reaper", "reaper", "--interval", "0.5")
        return self.fleet.start("scheduler", "scheduler")


@pytest.mark.timeout(900)
def test_chaos_soak_every_job_done_once_and_late_finishers_write_nothing(
    server: CrashSafePostgres, fleet: Fleet, tmp_path: Path
) -> None:
    seed = int(os.environ.get("ROTA_SOAK_SEED") or random.SystemRandom().randrange(10**6))
    soak = Soak(server, fleet, plan_from_env(random.Random(seed)), seed)
    plan = soak.plan
    began = time.monotonic()
    batches = [plan.jobs // (len(plan.actions) + 1)] * (len(plan.actions) + 1)
    batches[0] += plan.jobs - sum(batches)
    soak.enqueue(batches.pop(0))
    tick = schedule_store.upsert(
        soak.url, schedule_store.ScheduleSpec(TICK, TYPE, "* * * * *", payload={})
    )
    soak.query(
        "UPDATE rota.schedule SET next_run_at = date_trunc('minute', now()) - interval '1 minute'"
        " WHERE id = %s",
        tick["id"],
    )
    for _ in range(plan.workers):
        soak.start_worker()
    # Beside the reaper and the scheduler inside every worker, one of each alone.
    for name in ("reaper", "scheduler"):
        soak.start_service(name)
    wait_for(
        lambda: soak.scalar("SELECT count(*) FROM rota.job WHERE status = 'done'"),
        timeout=120,
        what="the first job done",
    )
    chaos_began = time.monotonic()

    # The chaos loop: one batch of fresh work, then one action, until the plan
    # or the time runs out; whatever work is left is enqueued anyway.
    for action in plan.actions:
        if time.monotonic() - chaos_began > plan.seconds:
            break
        soak.enqueue(batches.pop(0))
        acted = time.monotonic()
        soak.act(action)
        soak.action_seconds.append((action, round(time.monotonic() - acted, 1)))
        soak.figures["actions"] += 1
    while batches:
        soak.enqueue(batches.pop(0))
    chaos_seconds = time.monotonic() - chaos_began

    def ticked() -> bool:
        return bool(soak.scalar("SELECT count(*) FROM rota.job WHERE schedule_id = %s", tick["id"]))

    try:
        wait_for(ticked, timeout=60, what="a job from the soak's schedule")
    except AssertionError:
        activity = soak.query(
            "SELECT pid, application_name, state, xact_start, left(query, 80)"
            " FROM pg_stat_activity WHERE datname IS NOT NULL"
        )
        schedule = soak.query("SELECT * FROM rota.schedule WHERE id = %s", tick["id"])
        raise AssertionError(f"no tick: {schedule} {activity}") from None
    soak.query("UPDATE rota.schedule SET suspend = true WHERE id = %s", tick["id"])
    wait_for(
        lambda: (
            not soak.scalar(
                "SELECT count(*) FROM rota.job WHERE type = %s AND status IN ('ready', 'running')",
                TYPE,
            )
        ),
        timeout=plan.drain_seconds,
        what="every soak job to end",
    )
    died = [p.log_path.name for p in fleet.procs if not p.killed and not p.alive()]
    codes = fleet.stop_all()
    assert not died, f"processes ended on their own during the soak: {died}"
    assert all(code == 0 for code in codes.values()), {p.log_path.name: c for p, c in codes.items()}

    figures = measure(soak)
    figures.update(
        seed=seed,
        seconds=round(time.monotonic() - began, 1),
        startup_seconds=round(chaos_began - began, 1),
        chaos_seconds=round(chaos_seconds, 1),
        action_seconds=soak.action_seconds,
        key_index=key_index(fleet.db_url),
        **soak.figures,
    )
    print("\nchaos soak:", json.dumps(figures))
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=2))

    assert figures["actions"] == len(plan.actions) or os.environ.get("ROTA_SOAK") == "full"
    assert figures["jobs"] == plan.jobs
    assert figures["lost"] == 0, "jobs neither done nor cancelled"
    assert figures["duplicates"] == 0, "jobs with more than one effect"
    assert figures["without_effect"] == 0, "done jobs without their effect"
    assert figures["cancelled_with_effect"] == 0
    # A first attempt that outlived its timeout went on to complete: refused.
    assert figures["timeout_jobs"] == 0 or figures["timeouts_refused"] >= 1
    assert figures["foreign_effects"] == 0, "effects not written by the attempt that holds the row"
    assert figures["late_effects"] == 0, "effects written by a late finisher"
    assert figures["running"] == 0
    assert figures["ticks"] >= 1 and figures["tick_slots_doubled"] == 0
    # Every attempt a stopped worker held that had started (the others were
    # claimed ahead and never start) tried, resumed, to complete and was refused,
    # unless a later action killed that worker first, or restarted the server
    # under its completion (it then notes that in a file): the jobs of a claim in
    # flight at the stop are held only once it resumes, and may start after the
    # soak saw the others refused.
    assert (
        figures["late_refused"] + figures["late_interrupted"]
        == figures["late_started"]
        <= figures["late_held"]
    )
    if soak.figures["stops"]:
        assert figures["late_held"] >= 1, "the stopped worker held nothing"
    assert len(soak.late) <= figures["lease_expirations"] <= figures["extra_attempts"]


def _interrupted(path: Path) -> set[tuple[int, str, int]]:
    """Attempts whose completion a server restart cut off (soak_handlers notes them)."""
    if not path.exists():
        return set()
    found = set()
    for line in path.read_text().splitlines():
        job_id, worker, attempt = line.split()
        found.add((int(job_id), worker, int(attempt)))
    return found


def measure(soak: Soak) -> dict[str, Any]:
    one = soak.scalar
    ids = soak.enqueued
    late = soak.late
    unkilled = [a for proc, attempts in soak.late_by if not proc.killed for a in attempts]
    return {
        "jobs": one("SELECT count(*) FROM rota.job WHERE id = ANY(%s) AND type = %s", ids, TYPE),
        "lost": len(ids)
        - one(
            "SELECT count(*) FROM rota.job WHERE id = ANY(%s) AND status IN ('done', 'cancelled')",
            ids,
        ),
        "cancelled": one("SELECT count(*) FROM rota.job WHERE status = 'cancelled'"),
        "cancelled_with_effect": one(
            "SELECT count(*) FROM rota.job j WHERE j.status = 'cancelled'"
            " AND EXISTS (SELECT 1 FROM soak_effect e WHERE e.job_id = j.id)"
        ),
        "timeout_jobs": one(
            "SELECT count(*) FROM rota.job WHERE id = ANY(%s) AND timeout_seconds IS NOT NULL", ids
        ),
        "timeouts_refused": one(
            "SELECT count(DISTINCT r.job_id) FROM soak_refused r JOIN rota.job j ON j.id = r.job_id"
            " WHERE j.timeout_seconds IS NOT NULL AND r.attempt = 1"
        ),
        "running": one("SELECT count(*) FROM rota.job WHERE status = 'running'"),
        "ticks": one(
            "SELECT count(*) FROM rota.job j JOIN rota.schedule s ON s.id = j.schedule_id"
            " WHERE s.name = %s AND j.status = 'done'",
            TICK,
        ),
        "tick_schedule": [
            str(x)
            for x in soak.query(
                "SELECT next_run_at, last_slot, missed_slots, skipped_slots, suspend"
                " FROM rota.schedule WHERE name = %s",
                TICK,
            )[0]
        ],
        "tick_slots_doubled": one(
            "SELECT count(*) FROM (SELECT slot FROM rota.job WHERE schedule_id IS NOT NULL"
            " GROUP BY schedule_id, slot HAVING count(*) > 1) d"
        ),
        "effects": one("SELECT count(*) FROM soak_effect"),
        "duplicates": one("SELECT count(*) - count(DISTINCT job_id) FROM soak_effect"),
        "without_effect": one(
            "SELECT count(*) FROM rota.job j WHERE j.type = %s AND j.status = 'done'"
            " AND NOT EXISTS (SELECT 1 FROM soak_effect e WHERE e.job_id = j.id)",
            TYPE,
        ),
        "foreign_effects": one(
            "SELECT count(*) FROM soak_effect e JOIN rota.job j ON j.id = e.job_id"
            " WHERE e.worker IS DISTINCT FROM j.locked_by OR e.attempt <> j.attempts"
        ),
        "late_held": len(late),
        "late_effects": soak.among("soak_effect", late),
        "late_started": soak.among("soak_started", unkilled),
        "late_refused": soak.among("soak_refused", unkilled),
        "late_interrupted": len(set(unkilled) & _interrupted(soak.fleet.logs / "interrupted")),
        "late_killed_after": len(late) - len(unkilled),
        "refused": one("SELECT count(*) FROM soak_refused"),
        "reruns": one("SELECT count(*) FROM rota.job WHERE type = %s AND attempts > 1", TYPE),
        "extra_attempts": one(
            "SELECT coalesce(sum(greatest(attempts - 1, 0)), 0) FROM rota.job WHERE type = %s",
            TYPE,
        ),
        "lease_expirations": one("SELECT coalesce(sum(count), 0) FROM rota.lease_expiration"),
    }
