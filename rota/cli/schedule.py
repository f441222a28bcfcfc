"""`rota schedule ...`: recurring schedules.

Every command validates its input before writing anything: a bad cron
expression or time zone is exit 2 with a one-line reason, and nothing stored.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from rota import archive, cron, limits, schedule_store
from rota.cli.common import (
    UsageError,
    checked,
    database_url,
    decimal,
    non_negative_int,
    parse_instant,
    parse_json,
    positive_int,
    print_json,
    table,
    unique_flags,
    whole_number,
)
from rota.reading import shown
from rota.schedule_store import ScheduleSpec

_MAX_PREVIEW = 10_000


def register(sub: Any) -> None:
    group = sub.add_parser("schedule", help="recurring schedules (cron with a time zone)")
    commands = group.add_subparsers(dest="schedule_command", metavar="COMMAND", required=True)

    p = commands.add_parser("add", help="create a schedule, or change the one of that name")
    p.add_argument("name")
    p.add_argument("--type", required=True, dest="job_type", help="job type of each slot's job")
    p.add_argument("--cron", required=True, help="5 fields or @hourly, @daily, ...")
    p.add_argument("--timezone", default="UTC", help="IANA time zone (default UTC)")
    p.add_argument("--payload", help="JSON payload of each job (default {})")
    p.add_argument("--max-attempts", type=positive_int)
    p.add_argument(
        "--spread-seconds", type=non_negative_int, default=0, help="spread run_at over N seconds"
    )
    p.add_argument("--concurrency-policy", choices=schedule_store.POLICIES, default="Allow")
    p.add_argument(
        "--starting-deadline-seconds", type=positive_int, help="drop a slot later than this"
    )
    p.add_argument(
        "--priority",
        type=checked(whole_number, limits.priority),
        help="priority of each slot's job: 0 (first) to 9",
    )
    p.add_argument(
        "--timeout",
        type=checked(decimal, limits.timeout_seconds),
        metavar="SECONDS",
        help="each job's time limit",
    )
    p.add_argument("--group", help="each job's concurrency group (see rota limit)")
    unique_flags(
        p,
        "skip a slot less than this long after the slot of the schedule's last job",
        "skip a slot while a job of the schedule is ready, running or waiting",
    )
    p.add_argument("--suspend", action="store_true", help="store it suspended")
    p.set_defaults(func=cmd_add)

    p = commands.add_parser("list", help="every schedule with its next run and counters")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    for verb, func, text in [
        ("remove", cmd_remove, "delete a schedule (its jobs stay)"),
        ("suspend", cmd_suspend, "stop enqueuing a schedule's slots"),
        ("resume", cmd_resume, "enqueue again from the next slot (no replay)"),
    ]:
        p = commands.add_parser(verb, help=text)
        p.add_argument("name")
        p.set_defaults(func=func)

    p = commands.add_parser("preview", help="the next slots of an expression, DST applied")
    p.add_argument("--cron", required=True)
    p.add_argument("--timezone", default="UTC")
    p.add_argument("--from", dest="start", help="ISO-8601 instant (default now)")
    p.add_argument("--count", type=positive_int, default=10)
    p.set_defaults(func=cmd_preview)


def cmd_add(args: argparse.Namespace) -> int:
    spec = ScheduleSpec(
        name=args.name,
        job_type=args.job_type,
        cron=args.cron,
        timezone=args.timezone,
        payload=parse_json(args.payload),
        suspend=args.suspend,
        spread_seconds=args.spread_seconds,
        concurrency_policy=args.concurrency_policy,
        starting_deadline_seconds=args.starting_deadline_seconds,
        max_attempts=args.max_attempts,
        priority=args.priority,
        timeout_seconds=args.timeout,
        group=args.group,
        unique_for_seconds=args.unique_for,
        unique_active=args.unique_active,
    )
    archive.check_schedule(spec.job_type, spec.payload)
    row = schedule_store.upsert(database_url(), spec)
    local, utc = _instants(row["next_run_at"], row["timezone"])
    print(shown(f"{row['name']}: next run {local} ({utc})"))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = schedule_store.list_all(database_url())
    if args.json:
        print_json(rows)
        return 0
    print(table([_HEADER, *(_list_line(r) for r in rows)]), end="")
    return 0


_HEADER = ("NAME", "TYPE", "CRON", "TIMEZONE", "SUSPEND", "NEXT RUN", "NEXT RUN (UTC)",
           "LAST SLOT", "MISSED", "SKIPPED")  # fmt: skip


def _list_line(r: dict[str, Any]) -> tuple[str, ...]:
    local, utc = _instants(r["next_run_at"], r["timezone"])
    last = _instants(r["last_slot"], r["timezone"])[0] if r["last_slot"] else "-"
    suspend = str(r["suspend"]).lower()
    counters = (str(r["missed_slots"]), str(r["skipped_slots"]))
    return (
        r["name"],
        r["job_type"],
        r["cron"],
        r["timezone"],
        suspend,
        local,
        utc,
        last,
        *counters,
    )


def _instants(value: datetime, timezone: str) -> tuple[str, str]:
    """An instant in the schedule's own zone and in UTC, ISO-8601 with offsets."""
    try:
        local = value.astimezone(ZoneInfo(timezone)).isoformat()
    except (ValueError, KeyError, OSError):
        local = "?"
    return local, value.astimezone(UTC).isoformat()


def cmd_remove(args: argparse.Namespace) -> int:
    if not schedule_store.remove(database_url(), args.name):
        raise UsageError(f"no schedule named {args.name!r}")
    print(shown(f"{args.name}: removed"))
    return 0


def cmd_suspend(args: argparse.Namespace) -> int:
    return _set_suspended(args.name, True)


def cmd_resume(args: argparse.Namespace) -> int:
    return _set_suspended(args.name, False)


def _set_suspended(name: str, suspend: bool) -> int:
    row = schedule_store.set_suspended(database_url(), name, suspend)
    if row is None:
        raise UsageError(f"no schedule named {name!r}")
    local, utc = _instants(row["next_run_at"], row["timezone"])
    state = "suspended" if suspend else f"resumed, next run {local} ({utc})"
    print(shown(f"{name}: {state}"))
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    if args.count > _MAX_PREVIEW:
        raise UsageError(f"--count must be at most {_MAX_PREVIEW}")
    start = parse_instant(args.start, "--from") if args.start is not None else None
    for slot in cron.preview(args.cron, args.timezone, start, args.count):
        print(slot.isoformat())
    return 0
