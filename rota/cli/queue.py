"""`rota migrate`, `rota enqueue`, `rota jobs ...` and `rota dead ...`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from rota import inspect
from rota.cli.common import (
    UsageError,
    database_url,
    parse_instant,
    parse_json,
    positive_int,
    print_json,
)
from rota.enqueue import enqueue
from rota.migrate import migrate
from rota.settings import QueueSettings


def register(sub: Any) -> None:
    p = sub.add_parser("migrate", help="create or upgrade the rota schema")
    p.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="ROLE[,ROLE]",
        help="give existing roles the rights the workers and the operator need (repeatable)",
    )
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("enqueue", help="enqueue one job; prints its id")
    p.add_argument("type")
    p.add_argument("--payload", help="JSON payload (default {})")
    p.add_argument("--key", help="idempotency key: an existing key prints the existing id")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--run-at", help="ISO-8601 instant to run at (UTC when no offset)")
    when.add_argument("--delay", type=float, help="seconds from now")
    p.add_argument("--max-attempts", type=positive_int)
    p.add_argument(
        "--max-payload-bytes",
        type=positive_int,
        default=int(os.environ.get("ROTA_MAX_PAYLOAD_BYTES") or QueueSettings().max_payload_bytes),
        help="largest payload accepted (default: ROTA_MAX_PAYLOAD_BYTES or 262144)",
    )
    p.set_defaults(func=cmd_enqueue)

    jobs = sub.add_parser("jobs", help="list or show jobs").add_subparsers(
        dest="jobs_command", metavar="COMMAND", required=True
    )
    p = jobs.add_parser("list", help="the newest jobs, filtered")
    p.add_argument("--status")
    p.add_argument("--type")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs_list)
    p = jobs.add_parser("show", help="one job's whole row")
    p.add_argument("id", type=_job_id)
    p.set_defaults(func=cmd_jobs_show)

    dead = sub.add_parser("dead", help="the dead-letter list").add_subparsers(
        dest="dead_command", metavar="COMMAND", required=True
    )
    p = dead.add_parser("list", help="jobs that used up their attempts")
    p.add_argument("--type")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_dead_list)
    p = dead.add_parser("retry", help="dead jobs back to ready, with fresh attempts")
    p.add_argument("ids", nargs="*", type=_job_id)
    p.add_argument("--all", action="store_true", help="every dead job")
    p.set_defaults(func=cmd_dead_retry)


def _job_id(text: str) -> int:
    try:
        return positive_int(text)
    except UsageError:
        raise UsageError(f"not a job id: {text!r}") from None


def cmd_migrate(args: argparse.Namespace) -> int:
    roles = [role.strip() for value in args.grant for role in value.split(",")]
    if "" in roles:
        raise UsageError("--grant needs role names, e.g. --grant rota_worker")
    applied = migrate(database_url(), grant=roles)
    print(f"applied {len(applied)} migration(s)" + (f": {applied}" if applied else ""))
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = parse_json(args.payload)
    run_at = parse_instant(args.run_at, "--run-at") if args.run_at else None
    if args.delay is not None and args.delay < 0:
        raise UsageError(f"--delay must not be negative: {args.delay:g}")
    settings = QueueSettings(max_payload_bytes=args.max_payload_bytes)
    job_id = enqueue(
        database_url(),
        args.type,
        payload,
        key=args.key,
        run_at=run_at,
        delay=args.delay,
        max_attempts=args.max_attempts,
        settings=settings,
    )
    print(job_id)
    return 0


_COLUMNS = ["id", "type", "status", "attempts", "run_at", "locked_by", "last_error"]


def _table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("(no jobs)")
        return
    cells = [[_cell(row.get(c)) for c in _COLUMNS] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(_COLUMNS)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(_COLUMNS, widths, strict=True)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    text = str(value).splitlines()[0] if str(value) else ""
    return text[:60]


def cmd_jobs_list(args: argparse.Namespace) -> int:
    rows = inspect.list_jobs(
        database_url(), status=args.status, job_type=args.type, limit=args.limit
    )
    print_json(rows) if args.json else _table(rows)
    return 0


def cmd_jobs_show(args: argparse.Namespace) -> int:
    print_json(inspect.get_job(database_url(), args.id))
    return 0


def cmd_dead_list(args: argparse.Namespace) -> int:
    rows = inspect.list_jobs(database_url(), status="dead", job_type=args.type, limit=args.limit)
    print_json(rows) if args.json else _table(rows)
    return 0


def cmd_dead_retry(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all):
        raise UsageError("give job ids or --all (not both)")
    revived = inspect.retry_dead(database_url(), args.ids, all_dead=args.all)
    missing = sorted(set(args.ids) - set(revived))
    print(f"{len(revived)} job(s) back to ready" + (f": {revived}" if revived else ""))
    if missing:
        print(f"not dead (left alone): {missing}")
    return 0
