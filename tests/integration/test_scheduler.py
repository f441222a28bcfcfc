"""The scheduler against a real database, with the clock injected into SQL."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import rota
from rota import schedule_store as schedules
from rota.errors import InvalidInput
from rota.schedule_store import ScheduleSpec
from rota.schedule_store import upsert as upsert_schedule
from rota.scheduler import Scheduler, SchedulerSettings
from rota.services import run_loop

Conn = psycopg.Connection[Any]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def add(conn: Conn, now: datetime, **fields: Any) -> dict[str, Any]:
    spec = ScheduleSpec(**{"name": "s", "job_type": "t", "cron": "0 * * * *", **fields})
    return schedules.upsert(conn, spec, now=now)


def slots(conn: Conn, schedule_id: int) -> list[datetime]:
    rows = conn.execute(
        "SELECT slot FROM rota.job WHERE schedule_id = %s ORDER BY slot", (schedule_id,)
    ).fetchall()
    return [r["slot"] for r in rows]


def run_ticks(conn: Conn, start: datetime, end: datetime, step: timedelta) -> None:
    scheduler = Scheduler()
    now = start
    while now <= end:
        scheduler.run_once(conn, now=now)
        now += step


def test_upsert_get_list_remove(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 10, 20), payload={"a": 1}, spread_seconds=30)
    assert row["next_run_at"] == utc(2026, 1, 1, 11)
    assert schedules.get(conn, "s")["payload"] == {"a": 1}  # type: ignore[index]
    assert [r["name"] for r in schedules.list_all(conn)] == ["rota/archive", "s"]
    assert schedules.remove(conn, "s") is True
    assert schedules.remove(conn, "s") is False
    assert schedules.get(conn, "s") is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "61 * * * *"}, "cron expression"),
        ({"timezone": "Europe/Nowhere"}, "unknown time zone"),
        ({"payload": {"x": "y" * 300_000}}, "payload"),
        ({"concurrency_policy": "Replace"}, "concurrency policy"),
        ({"spread_seconds": -1}, "spread_seconds"),
        ({"starting_deadline_seconds": 0}, "starting_deadline_seconds"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"name": " "}, "name"),
        ({"group": ""}, "group"),
        ({"unique_for_seconds": 0}, "more than 0"),
        ({"unique_for_seconds": 1e12}, "at most"),
        ({"unique_active": "yes"}, "True or False"),
        ({"unique_for_seconds": 60, "unique_active": True}, "not both"),
    ],
)
def test_invalid_spec_stores_nothing(conn: Conn, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        add(conn, utc(2026, 1, 1), **fields)
    assert conn.execute("SELECT count(*) AS n FROM rota.schedule").fetchone()["n"] == 1  # type: ignore[index]


def test_day_of_five_minute_slots_through_five_racing_schedulers(db_url: str) -> None:
    day = utc(2026, 6, 1)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:  # type: ignore[arg-type]
        ids = [
            add(conn, day - timedelta(minutes=1), name=f"s{i}", cron="*/5 * * * *")["id"]
            for i in range(3)
        ]
    ticks = [day + timedelta(seconds=150 * i) for i in range(576)]  # every 2.5 minutes
    barrier = threading.Barrier(5)
    errors: list[BaseException] = []

    def instance(seed: int) -> None:
        rng = random.Random(seed)
        scheduler = Scheduler(SchedulerSettings())
        try:
            with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:  # type: ignore[arg-type]
                for tick in ticks:
                    barrier.wait(timeout=30)
                    scheduler.run_once(c, now=tick + timedelta(milliseconds=rng.randint(0, 3000)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=instance, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    expected = [day + timedelta(minutes=5 * i) for i in range(288)]
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:  # type: ignore[arg-type]
        for schedule_id in ids:
            assert slots(conn, schedule_id) == expected
        rows = conn.execute(
            "SELECT missed_slots FROM rota.schedule WHERE name LIKE 's%%'"
        ).fetchall()
        assert [r["missed_slots"] for r in rows] == [0, 0, 0]


BERLIN_DAYS = [
    ("30 2 * * *", utc(2026, 3, 28, 23), [utc(2026, 3, 29, 1)]),
    ("30 2 * * *", utc(2026, 10, 24, 22), [utc(2026, 10, 25, 0, 30)]),
    (
        "0 * * * *",
        utc(2026, 3, 28, 23),
        [utc(2026, 3, 28, 23)] + [utc(2026, 3, 29, h) for h in range(0, 22)],
    ),
    (
        "0 * * * *",
        utc(2026, 10, 24, 22),
        [utc(2026, 10, 24, 22), utc(2026, 10, 24, 23)] + [utc(2026, 10, 25, h) for h in range(23)],
    ),
]


@pytest.mark.parametrize(("expr", "midnight", "expected"), BERLIN_DAYS)
def test_berlin_dst_days(
    conn: Conn, expr: str, midnight: datetime, expected: list[datetime]
) -> None:
    """Local midnight to midnight of 2026-03-29 (23 h) and 2026-10-25 (25 h)."""
    hours = 23 if midnight.month == 3 else 25
    row = add(conn, midnight - timedelta(seconds=1), cron=expr, timezone="Europe/Berlin")
    end = midnight + timedelta(hours=hours) - timedelta(seconds=1)
    run_ticks(conn, midnight, end, timedelta(minutes=5))
    assert slots(conn, row["id"]) == expected
    keys = conn.execute(
        "SELECT idempotency_key FROM rota.job WHERE schedule_id = %s ORDER BY slot", (row["id"],)
    ).fetchall()
    assert keys[0]["idempotency_key"] == schedules.idempotency_key(row["id"], expected[0])


def test_downtime_enqueues_only_the_latest_slot(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 8, 30))
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 5))
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 12, 30))  # down 09:00:05 - 12:30
    assert slots(conn, row["id"]) == [utc(2026, 1, 1, 9), utc(2026, 1, 1, 12)]
    after = schedules.get(conn, "s")
    assert after is not None
    assert (after["missed_slots"], after["last_slot"]) == (2, utc(2026, 1, 1, 12))
    assert after["next_run_at"] == utc(2026, 1, 1, 13)


def test_starting_deadline_drops_a_slot_too_old(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 8, 30), starting_deadline_seconds=600)
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 5))
    result = Scheduler().run_once(conn, now=utc(2026, 1, 1, 12, 30))
    assert (result.enqueued, result.missed) == (0, 3)
    assert slots(conn, row["id"]) == [utc(2026, 1, 1, 9)]
    assert schedules.get(conn, "s")["missed_slots"] == 3  # type: ignore[index]
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 13, 9, 59))  # 599 s late: still in time
    assert slots(conn, row["id"])[-1] == utc(2026, 1, 1, 13)


def test_forbid_skips_while_the_previous_job_runs(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 8, 30), concurrency_policy="Forbid")
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1))
    conn.execute(
        "UPDATE rota.job SET status = 'running', locked_by = 'w' WHERE schedule_id = %s",
        (row["id"],),
    )
    for hour in (10, 11):
        result = Scheduler().run_once(conn, now=utc(2026, 1, 1, hour, 0, 1))
        assert (result.enqueued, result.skipped, result.missed) == (0, 1, 0)
    conn.execute("UPDATE rota.job SET status = 'done' WHERE schedule_id = %s", (row["id"],))
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 12, 0, 1))
    assert slots(conn, row["id"]) == [utc(2026, 1, 1, 9), utc(2026, 1, 1, 12)]
    after = schedules.get(conn, "s")
    assert after is not None
    assert (after["skipped_slots"], after["missed_slots"]) == (2, 0)


def test_allow_enqueues_beside_a_running_job(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 8, 30))
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1))
    conn.execute("UPDATE rota.job SET status = 'running' WHERE schedule_id = %s", (row["id"],))
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 10, 0, 1))
    assert len(slots(conn, row["id"])) == 2


def test_suspend_and_resume_without_replay(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 8, 30))
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1))
    schedules.set_suspended(conn, "s", True, now=utc(2026, 1, 1, 9, 30))
    run_ticks(conn, utc(2026, 1, 1, 9, 31), utc(2026, 1, 1, 14), timedelta(minutes=10))
    assert slots(conn, row["id"]) == [utc(2026, 1, 1, 9)]
    resumed = schedules.set_suspended(conn, "s", False, now=utc(2026, 1, 1, 14, 20))
    assert resumed is not None and resumed["next_run_at"] == utc(2026, 1, 1, 15)
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 14, 21))
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 15, 0, 1))
    assert slots(conn, row["id"]) == [utc(2026, 1, 1, 9), utc(2026, 1, 1, 15)]
    assert schedules.get(conn, "s")["missed_slots"] == 0  # type: ignore[index]
    assert schedules.set_suspended(conn, "nope", True) is None


def test_spread_moves_run_at_not_the_slot(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 8, 30), name="spread-me", spread_seconds=600)
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1))
    job = conn.execute("SELECT slot, run_at, idempotency_key FROM rota.job").fetchone()
    assert job is not None
    offset = schedules.spread_offset("spread-me", 600)
    assert 0 <= offset < 600
    assert job["slot"] == utc(2026, 1, 1, 9)
    assert job["run_at"] == utc(2026, 1, 1, 9) + timedelta(seconds=offset)
    assert job["idempotency_key"] == f"schedule:{row['id']}:2026-01-01T09:00:00+00:00"


def test_a_slot_handled_twice_is_still_one_job(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 8, 30), payload={"k": "v"}, max_attempts=4)
    Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1))
    conn.execute(
        "UPDATE rota.schedule SET next_run_at = %s WHERE id = %s", (utc(2026, 1, 1, 9), row["id"])
    )
    result = Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 2))
    assert (result.schedules, result.enqueued) == (1, 0)
    job = conn.execute("SELECT type, payload, max_attempts FROM rota.job").fetchall()
    assert job == [{"type": "t", "payload": {"k": "v"}, "max_attempts": 4}]


def test_changing_the_cron_recomputes_next_run(conn: Conn) -> None:
    add(conn, utc(2026, 1, 1, 8, 30))
    same = add(conn, utc(2026, 1, 1, 9, 30), payload={"new": True})
    assert same["next_run_at"] == utc(2026, 1, 1, 9)  # still due, not skipped
    changed = add(conn, utc(2026, 1, 1, 9, 30), cron="*/15 * * * *")
    assert changed["next_run_at"] == utc(2026, 1, 1, 9, 45)


def test_a_cron_written_another_way_keeps_a_due_slot(conn: Conn) -> None:
    # The same slots written differently (spacing, @hourly) are no change of
    # timing: a slot already due stays due rather than being dropped uncounted.
    add(conn, utc(2026, 1, 1, 8, 30))
    for cron in ("0  *  * * *", "@hourly", "0 0-23 * * *"):
        same = add(conn, utc(2026, 1, 1, 9, 30), cron=cron)
        assert same["next_run_at"] == utc(2026, 1, 1, 9), cron


def test_changes_are_notified(db_url: str, conn: Conn) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN rota_schedule")
        add(conn, utc(2026, 1, 1))
        schedules.remove(conn, "s")
        names = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert names == ["s", "s"]


def test_builtin_archive_schedule(conn: Conn) -> None:
    row = schedules.get(conn, "rota/archive")
    assert row is not None and row["job_type"] == "rota.archive"
    assert row["next_run_at"].minute % 5 == row["next_run_at"].second == 0


def test_a_next_run_that_is_no_slot_is_realigned_without_a_job(conn: Conn) -> None:
    conn.execute(
        "UPDATE rota.schedule SET suspend = false, next_run_at = %s WHERE name = 'rota/archive'",
        (utc(2030, 1, 1, 0, 1, 30),),
    )
    result = Scheduler().run_once(conn, now=utc(2030, 1, 1, 0, 2))
    assert (result.schedules, result.count) == (1, 0)
    assert schedules.get(conn, "rota/archive")["next_run_at"] == utc(2030, 1, 1, 0, 5)  # type: ignore[index]


def test_loop_wakes_on_notify_and_stops(db_url: str, conn: Conn) -> None:
    conn.execute("UPDATE rota.schedule SET suspend = true")
    stop = threading.Event()
    scheduler = Scheduler(SchedulerSettings(poll_interval_seconds=60))
    thread = threading.Thread(target=run_loop, args=(scheduler, db_url, stop))
    thread.start()
    try:
        row = add(conn, None, cron="* * * * *")  # type: ignore[arg-type]
        conn.execute(
            "UPDATE rota.schedule SET next_run_at = date_trunc('minute', now()) WHERE id = %s",
            (row["id"],),
        )
        schedules.upsert(conn, ScheduleSpec("s", "t", "* * * * *", payload={"poke": 1}))
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while not slots(conn, row["id"]) and datetime.now(UTC) < deadline:
            stop.wait(0.05)
        assert len(slots(conn, row["id"])) == 1
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_concurrent_upserts_of_one_name(db_url: str, conn: Conn) -> None:
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def upsert(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            spec = ScheduleSpec("same", "t", "0 * * * *", payload={"i": i})
            schedules.upsert(db_url, spec, now=utc(2026, 1, 1))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=upsert, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    rows = conn.execute("SELECT count(*) AS n FROM rota.schedule WHERE name = 'same'").fetchone()
    assert rows == {"n": 1}


def test_names_under_rota_are_reserved_for_the_built_in_schedules(conn) -> None:
    builtin = schedules.get(conn, "rota/archive")
    for name, job_type in [("rota/mine", "t"), ("rota/archive", "t")]:
        with pytest.raises(InvalidInput, match=r"built-in|reserved"):
            schedules.upsert(conn, ScheduleSpec(name, job_type, "@daily"))
    with pytest.raises(InvalidInput, match="suspend it instead"):
        schedules.remove(conn, "rota/archive")
    assert schedules.get(conn, "rota/archive") == builtin
    # The built-in keeps its job type but takes new settings, and may be suspended.
    payload = {"done_retention_seconds": 3600}
    schedules.upsert(
        conn, ScheduleSpec("rota/archive", "rota.archive", "*/5 * * * *", payload=payload)
    )
    assert schedules.get(conn, "rota/archive")["payload"] == payload  # type: ignore[index]
    assert schedules.set_suspended(conn, "rota/archive", True) is not None
    # A JobSchedule of namespace rota is '<namespace>/<name>': the operator may write it.
    schedules.upsert(conn, ScheduleSpec("rota/tick", "t", "@daily"), namespaced=True)


def test_a_schedules_jobs_carry_its_group(conn: Conn) -> None:
    row = add(conn, utc(2026, 1, 1, 9, 30), group="customer-3")
    run_ticks(conn, utc(2026, 1, 1, 10), utc(2026, 1, 1, 11), timedelta(hours=1))
    groups = conn.execute(
        "SELECT group_key FROM rota.job WHERE schedule_id = %s", (row["id"],)
    ).fetchall()
    assert groups == [{"group_key": "customer-3"}] * 2
    add(conn, utc(2026, 1, 1, 11, 30))  # changed: no group any more
    assert schedules.get(conn, "s")["group_key"] is None  # type: ignore[index]


def test_unique_active_skips_a_slot_while_a_job_of_the_schedule_is_active(conn: Conn) -> None:
    """Keyed per schedule: a slot makes no job while any earlier slot's job is
    ready or running (counted as skipped, like Forbid); once it has finished,
    the next slot makes one. Each job keeps its slot's idempotency key."""
    row = add(conn, utc(2026, 1, 1, 8, 30), unique_active=True)
    assert Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1)).enqueued == 1
    result = Scheduler().run_once(conn, now=utc(2026, 1, 1, 10, 0, 1))  # the 9:00 job is ready
    assert (result.enqueued, result.skipped, result.missed) == (0, 1, 0)
    conn.execute("UPDATE rota.job SET status = 'running', locked_by = 'w'")
    result = Scheduler().run_once(conn, now=utc(2026, 1, 1, 13, 0, 1))  # 11:00, 12:00 missed
    assert (result.enqueued, result.skipped, result.missed) == (0, 1, 2)
    conn.execute("UPDATE rota.job SET status = 'done'")
    assert Scheduler().run_once(conn, now=utc(2026, 1, 1, 14, 0, 1)).enqueued == 1
    jobs = conn.execute(
        "SELECT slot, idempotency_key, unique_key, unique_active FROM rota.job ORDER BY slot"
    ).fetchall()
    assert [j["slot"] for j in jobs] == [utc(2026, 1, 1, 9), utc(2026, 1, 1, 14)]
    assert jobs[1]["idempotency_key"] == f"schedule:{row['id']}:2026-01-01T14:00:00+00:00"
    assert {(j["unique_key"], j["unique_active"]) for j in jobs} == {
        (f"schedule:{row['id']}", True)
    }
    after = schedules.get(conn, "s")
    assert after is not None
    assert (after["skipped_slots"], after["missed_slots"], after["last_slot"]) == (
        2,
        2,
        utc(2026, 1, 1, 14),
    )


def test_unique_for_makes_one_job_per_window_of_slots(conn: Conn) -> None:
    """Every 15 minutes with a 3600 s window: one job an hour, whether or not the
    last job has run; the window runs from slot to slot, not from the tick."""
    row = add(conn, utc(2026, 1, 1, 8, 50), cron="*/15 * * * *", unique_for_seconds=3600)
    run_ticks(conn, utc(2026, 1, 1, 9, 0, 1), utc(2026, 1, 1, 11, 0, 1), timedelta(minutes=15))
    conn.execute("UPDATE rota.job SET status = 'done'")
    # A late tick judges 11:15 by its slot: still inside the 11:00 job's hour.
    result = Scheduler().run_once(conn, now=utc(2026, 1, 1, 11, 29))
    assert (result.enqueued, result.skipped) == (0, 1)
    assert slots(conn, row["id"]) == [utc(2026, 1, 1, 9), utc(2026, 1, 1, 10), utc(2026, 1, 1, 11)]
    assert schedules.get(conn, "s")["skipped_slots"] == 7  # type: ignore[index]
    # 12:00 is exactly an hour after 11:00: the window has passed.
    assert Scheduler().run_once(conn, now=utc(2026, 1, 1, 12, 0, 1)).enqueued == 1


def test_a_unique_slot_handled_twice_is_one_job_and_no_skip(conn: Conn) -> None:
    for name, kind in (("a", {"unique_active": True}), ("f", {"unique_for_seconds": 3600})):
        row = add(conn, utc(2026, 1, 1, 8, 30), name=name, **kind)
        Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1))
        conn.execute(
            "UPDATE rota.schedule SET next_run_at = %s WHERE id = %s",
            (utc(2026, 1, 1, 9), row["id"]),
        )
        result = Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 2))
        assert (result.enqueued, result.skipped) == (0, 0)
        assert slots(conn, row["id"]) == [utc(2026, 1, 1, 9)]


def test_suspend_and_resume_keep_group_and_uniqueness(conn: Conn) -> None:
    add(conn, utc(2026, 1, 1, 8, 30), group="g", unique_for_seconds=90.5)
    schedules.set_suspended(conn, "s", True, now=utc(2026, 1, 1, 8, 31))
    row = schedules.set_suspended(conn, "s", False, now=utc(2026, 1, 1, 8, 32))
    assert row is not None
    assert (row["group_key"], row["unique_for_seconds"], row["unique_active"]) == ("g", 90.5, False)


T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_one_schedule_the_database_refuses_stops_no_other(conn, caplog) -> None:
    # A job type too long for the index (stored by hand): its enqueue is refused.
    # The scheduler logs it, moves that schedule past the slot, and goes on.
    for name in ("a-bad", "b-good"):
        upsert_schedule(conn, ScheduleSpec(name, "t", "0 * * * *"), now=T0)
    # Written around the table's own checks (migration 0024 refuses it otherwise).
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        "UPDATE rota.schedule SET job_type ="
        " (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) AS i)"
        " WHERE name = 'a-bad'"
    )
    conn.execute("RESET session_replication_role")
    tick = T0 + timedelta(hours=1, minutes=1)
    result = Scheduler().run_once(conn, now=tick)
    assert result.enqueued == 1
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 1
    bad = conn.execute("SELECT * FROM rota.schedule WHERE name = 'a-bad'").fetchone()
    assert bad["next_run_at"] > tick
    assert "schedule 'a-bad'" in caplog.text and "refused" in caplog.text


def test_no_other_job_can_take_a_schedule_s_keys_ahead_of_its_slots(conn: Conn) -> None:
    # The keys of a schedule's jobs can be guessed: a job enqueued ahead under
    # a slot's key made the scheduler's insert do nothing ("0 job(s) enqueued",
    # the slot gone), and one under 'schedule:<id>' with a long window made a
    # unique-for schedule skip every slot. The prefix is the schedules' alone,
    # at every door.
    every = add(conn, utc(2026, 1, 1, 8, 30), name="every")
    windowed = add(conn, utc(2026, 1, 1, 8, 30), name="windowed", unique_for_seconds=60)
    slot_key = schedules.idempotency_key(every["id"], utc(2026, 1, 1, 9))
    unique_key = schedules.unique_key(windowed["id"])
    with pytest.raises(InvalidInput, match=r"^an idempotency key must not start with 'schedule:'"):
        rota.enqueue(conn, "noop", key=slot_key)
    with pytest.raises(InvalidInput, match="'schedule:'"):
        rota.enqueue(conn, "noop", key=unique_key, unique_for=315360000)
    for statement in (
        f"SELECT rota.enqueue('noop', '{{}}', '{slot_key}')",
        f"INSERT INTO rota.job (type, idempotency_key) VALUES ('noop', '{slot_key}')",
        f"INSERT INTO rota.job (type, unique_key, schedule_id)"
        f" VALUES ('noop', '{unique_key}', {every['id']})",
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="'schedule:'"):
            conn.execute(statement)  # type: ignore[arg-type]
    job = rota.enqueue(conn, "noop", key="mine")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="'schedule:'"):
        conn.execute("UPDATE rota.job SET idempotency_key = %s WHERE id = %s", (slot_key, job))
    result = Scheduler().run_once(conn, now=utc(2026, 1, 1, 9, 0, 1))
    assert (result.enqueued, result.skipped) == (2, 0)
    assert slots(conn, every["id"]) == slots(conn, windowed["id"]) == [utc(2026, 1, 1, 9)]


def test_a_unique_for_window_is_anchored_to_the_first_slot_not_the_hour(conn: Conn) -> None:
    # docs/flow-control.md's example: every 15 minutes with a 3600 s window,
    # created at 10:20, makes the jobs of 10:30, 11:30 and 12:30.
    row = add(conn, utc(2026, 6, 1, 10, 20), cron="*/15 * * * *", unique_for_seconds=3600)
    run_ticks(conn, utc(2026, 6, 1, 10, 21), utc(2026, 6, 1, 13, 20), timedelta(minutes=1))
    assert slots(conn, row["id"]) == [utc(2026, 6, 1, 10, 30), utc(2026, 6, 1, 11, 30),
                                      utc(2026, 6, 1, 12, 30)]  # fmt: skip
