"""The scheduler: turns the due slots of recurring schedules into jobs.

A validated `SchedulerSettings`, a `run_once()` that tests call with a frozen
clock, and `rota.services.run_loop` to sleep, listen and log. Any number
of schedulers may run against one database: due schedules are locked with
SKIP LOCKED, each is handled in its own short transaction, and a slot's job
carries the idempotency key ``schedule:<id>:<slot>``, so a slot is one job
however many schedulers see it. The scheduler never runs jobs itself.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime, timedelta
from typing import Any

from rota import cron, limits, schedule_store, sql
from rota.db import Conn, ConnOrDsn, connection, fetch_all
from rota.errors import DatabaseError, InvalidInput
from rota.reading import RawInstant, RawJson
from rota.services import Service
from rota.settings import QueueSettings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    poll_interval_seconds: float = 5.0
    """Longest sleep between ticks, in seconds. The loop also wakes when the
    earliest schedule comes due and on a NOTIFY of a schedule change."""

    max_schedules_per_tick: int = 1000
    """Most schedules one `run_once` handles; the loop ticks again at once when
    it hit the cap, so a shutdown request is never kept waiting long."""

    default_max_attempts: int = QueueSettings().default_max_attempts
    """Attempts of a slot's job when its schedule does not set max_attempts."""

    def __post_init__(self) -> None:
        limits.interval_seconds(self.poll_interval_seconds, "scheduler poll interval")
        if self.max_schedules_per_tick < 1 or self.default_max_attempts < 1:
            raise InvalidInput("max_schedules_per_tick and default_max_attempts must be >= 1")


@dataclasses.dataclass(frozen=True)
class SchedulerResult:
    schedules: int = 0
    """Due schedules handled."""
    enqueued: int = 0
    """Jobs created for slots."""
    missed: int = 0
    """Slots passed over because no scheduler ran in time (or past the deadline)."""
    skipped: int = 0
    """Slots passed over by concurrency_policy Forbid, or by the schedule's
    unique_active (a job of it still active) or unique_for_seconds (inside the
    window of its last job)."""
    capped: bool = False
    """True when max_schedules_per_tick stopped the tick early."""

    @property
    def count(self) -> int:
        """Slots acted on (enqueued, missed or skipped): worth a log line when above 0."""
        return self.enqueued + self.missed + self.skipped

    def __str__(self) -> str:
        """The log line: what the tick did, in words."""
        return (
            f"{self.schedules} due schedule(s): {self.enqueued} job(s) enqueued,"
            f" {self.missed} slot(s) missed, {self.skipped} skipped"
            + ("; more due" if self.capped else "")
        )

    def __add__(self, other: SchedulerResult) -> SchedulerResult:
        return SchedulerResult(
            self.schedules + other.schedules,
            self.enqueued + other.enqueued,
            self.missed + other.missed,
            self.skipped + other.skipped,
            self.capped or other.capped,
        )


def _unreadable(row: dict[str, Any]) -> str:
    """Why a due schedule's row cannot make its job ("" when it can): a value
    Python cannot hold, read as its text by rota.reading."""
    if isinstance(row["next_run_at"], RawInstant):
        return f"next_run_at is {row['next_run_at']}"
    if isinstance(row["payload"], RawJson):
        return f"payload is nested too deep to read ({len(row['payload'])} bytes)"
    return ""


class Scheduler(Service):
    name = "scheduler"
    wake_channel = schedule_store.NOTIFY_CHANNEL
    """Every schedule change is notified here: a sleeping scheduler looks again."""

    def __init__(self, settings: SchedulerSettings | None = None) -> None:
        self.settings = settings or SchedulerSettings()

    @property
    def interval_seconds(self) -> float:
        return self.settings.poll_interval_seconds

    def next_wait(self, conn: Conn) -> float:
        """How long to sleep: until the earliest schedule is due, at most the poll interval."""
        return self.wait_until_due(conn, sql.query("schedule_earliest_due"), {"now": None})

    def run_once(self, conn_or_dsn: ConnOrDsn, now: datetime | None = None) -> SchedulerResult:
        """Handle every due schedule, each in its own transaction."""
        result = SchedulerResult()
        with connection(conn_or_dsn) as conn:
            for _ in range(self.settings.max_schedules_per_tick):
                with conn.transaction():
                    rows = fetch_all(conn, sql.query("schedule_next_due"), {"now": now})
                    if not rows:
                        return result
                    result += self._fire_or_pass(conn, rows[0], now)
        return dataclasses.replace(result, capped=True)

    def _fire_or_pass(
        self, conn: Conn, row: dict[str, Any], now: datetime | None
    ) -> SchedulerResult:
        """`_fire`, in a savepoint: a slot the database refuses (a job type too long
        for its index, say) is logged and passed over (counted as missed), so one
        bad schedule never stops the scheduler for the others. An outage is not a
        refusal: it ends the tick, and the slot is tried again."""
        try:
            with conn.transaction():
                return self._fire(conn, row, now)
        except DatabaseError as exc:
            tick: datetime = row["tick"]
            schedule = cron.Schedule(row["cron"], row["timezone"])  # _fire computed it
            count, _ = schedule.due(row["next_run_at"], tick)
            log.error(
                "schedule %r: the database refused its slot (%s); %d slot(s) passed over",
                row["name"],
                exc,
                count,
            )
            next_run_at = schedule.next_slot(tick) or tick + timedelta(days=1)
            self._advance(conn, row, next_run_at, None, count, 0)
            return SchedulerResult(schedules=1, missed=count)

    def _fire(self, conn: Conn, row: dict[str, Any], now: datetime | None) -> SchedulerResult:
        """Enqueue the latest due slot of one locked schedule and advance it."""
        tick: datetime = row["tick"]
        try:
            schedule = cron.Schedule(row["cron"], row["timezone"])
        except InvalidInput as exc:  # stored by hand, or a time zone this host lacks
            log.error("schedule %r cannot be computed: %s", row["name"], exc)
            self._advance(conn, row, tick + timedelta(hours=1), None, 0, 0)
            return SchedulerResult(schedules=1)
        unreadable = _unreadable(row)
        if unreadable:  # written around the checks: this slot is passed over, alone
            log.error("schedule %r: unreadable row: %s; slot passed over", row["name"], unreadable)
            self._advance(
                conn, row, schedule.next_slot(tick) or tick + timedelta(days=1), None, 1, 0
            )
            return SchedulerResult(schedules=1, missed=1)
        count, latest = schedule.due(row["next_run_at"], tick)
        next_run_at = schedule.next_slot(tick) or tick + timedelta(days=1)
        if latest is None:  # next_run_at was not a slot (a new built-in row): realign
            self._advance(conn, row, next_run_at, None, 0, 0)
            return SchedulerResult(schedules=1)
        deadline = row["starting_deadline_seconds"]
        if deadline is not None and (tick - latest).total_seconds() > deadline:
            self._advance(conn, row, next_run_at, None, count, 0)
            return SchedulerResult(schedules=1, missed=count)
        if row["concurrency_policy"] == "Forbid" and self._previous_active(conn, row):
            self._advance(conn, row, next_run_at, None, count - 1, 1)
            return SchedulerResult(schedules=1, missed=count - 1, skipped=1)
        created = self._enqueue(conn, row, latest, now)
        held = schedule_store.held_key(row) is not None  # a unique schedule's refusal
        if not created and held and not self._slot_enqueued(conn, row, latest):
            self._advance(conn, row, next_run_at, None, count - 1, 1)
            return SchedulerResult(schedules=1, missed=count - 1, skipped=1)
        self._advance(conn, row, next_run_at, latest, count - 1, 0)
        return SchedulerResult(schedules=1, enqueued=int(created), missed=count - 1)

    @staticmethod
    def _slot_enqueued(conn: Conn, row: dict[str, Any], slot: datetime) -> bool:
        """Whether the slot has its job already (made by an earlier tick): then a
        refused insert is that, not a skip for uniqueness."""
        key = schedule_store.idempotency_key(row["id"], slot)
        return bool(
            fetch_all(conn, sql.query("schedule_slot_enqueued"), {"key": key})[0]["enqueued"]
        )

    def _previous_active(self, conn: Conn, row: dict[str, Any]) -> bool:
        found = fetch_all(
            conn, sql.query("schedule_previous_job_active"), {"schedule_id": row["id"]}
        )
        return bool(found[0]["active"])

    def _enqueue(
        self, conn: Conn, row: dict[str, Any], slot: datetime, now: datetime | None
    ) -> bool:
        """Insert the slot's job; False when it was not made (the slot has its job,
        or the schedule's unique_active or unique_for_seconds refused it)."""
        offset = schedule_store.spread_offset(row["name"], row["spread_seconds"])
        made = schedule_store.enqueue_job(
            conn,
            row,
            slot,
            key=schedule_store.idempotency_key(row["id"], slot),
            run_at=slot + timedelta(seconds=offset),
            max_attempts=row["max_attempts"] or self.settings.default_max_attempts,
            now=now,
        )
        return made is not None

    @staticmethod
    def _advance(
        conn: Conn,
        row: dict[str, Any],
        next_run_at: datetime,
        last_slot: datetime | None,
        missed: int,
        skipped: int,
    ) -> None:
        params = {
            "id": row["id"],
            "next_run_at": next_run_at,
            "last_slot": last_slot,
            "missed": missed,
            "skipped": skipped,
        }
        fetch_all(conn, sql.query("schedule_advance"), params)
