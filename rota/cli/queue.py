"""`rota migrate`, `rota enqueue`, `rota pause` and `rota resume`."""

from __future__ import annotations

import argparse
from typing import Any

from rota import control, limits
from rota.cli.common import (
    UsageError,
    checked,
    database_url,
    decimal,
    parse_instant,
    parse_json,
    positive_int,
    unique_flags,
    whole_number,
)
from rota.cli.timeouts import option_or_env
from rota.enqueue import enqueue
from rota.migrate import KEY_INDEXES, NEWER, describe_key_index, migrate, unknown, use_key_index
from rota.reading import shown
from rota.settings import QueueSettings


def register(sub: Any) -> None:
    p = sub.add_parser("migrate", help="create or upgrade the rota schema")
    for flag, text in GRANT_FLAGS.items():
        p.add_argument(flag, action="append", default=[], metavar="ROLE[,ROLE]", help=text)
    p.add_argument(
        "--key-index",
        choices=KEY_INDEXES,
        help="keep idempotency keys unique by the unique constraint (every row has an entry)"
        " or by a partial unique index over keyed rows only (cheaper; every client must"
        " be 0.2 or later): see docs/operations.md, The key index",
    )
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("enqueue", help="enqueue one job; prints its id")
    p.add_argument("type")
    p.add_argument("--payload", help="JSON payload (default {})")
    p.add_argument("--key", help="idempotency key: an existing key prints the existing id")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--run-at", help="ISO-8601 instant to run at (UTC when no offset)")
    when.add_argument(
        "--delay", type=checked(decimal, limits.delay_seconds), help="seconds from now"
    )
    # --max-attempts follows the rule of the API
    p.add_argument("--max-attempts", type=checked(whole_number, limits.whole))
    p.add_argument(
        "--priority",
        type=checked(whole_number, limits.priority),
        help="0 (runs first) to 9; default 0",
    )
    p.add_argument(
        "--timeout",
        type=checked(decimal, limits.timeout_seconds),
        metavar="SECONDS",
        help="time limit of each attempt",
    )
    unique_flags(
        p,
        "with --key: the key gives the existing id only this long after its first job",
        "with --key: the key gives the existing id only while its job is ready, running or waiting",
    )
    p.add_argument(
        "--group", metavar="G", help="the job's concurrency group (a tenant, an account)"
    )
    p.add_argument(
        "--max-payload-bytes",
        type=positive_int,
        help="largest payload accepted (default: ROTA_MAX_PAYLOAD_BYTES or 262144)",
    )
    p.set_defaults(func=cmd_enqueue)

    for verb, func, text in [
        ("pause", cmd_pause, "stop workers from claiming jobs of these types"),
        ("resume", cmd_resume, "let workers claim jobs of these types again"),
    ]:
        p = sub.add_parser(verb, help=text)
        p.add_argument("types", nargs="*", metavar="TYPE")
        p.add_argument("--all", action="store_true", help="every job type")
        p.set_defaults(func=func)


GRANT_FLAGS = {
    "--grant-worker": "give existing roles exactly what workers, schedulers, reapers and the"
    " operator need: no DDL, no console tables (repeatable)",
    "--grant": "the runtime grant of 0.3: --grant-worker's rights and the console's tables"
    " (repeatable)",
    "--grant-enqueue": "give existing roles EXECUTE on rota.enqueue (and rota.emit) only"
    " (repeatable)",
    "--grant-read": "give existing roles SELECT for dashboards and the read-only console"
    " (repeatable)",
}


def _roles(values: list[str], flag: str) -> list[str]:
    roles = [role.strip() for value in values for role in value.split(",")]
    if "" in roles:
        raise UsageError(f"{flag} needs role names, e.g. {flag} rota_worker")
    return roles


def cmd_migrate(args: argparse.Namespace) -> int:
    grants = {flag: _roles(getattr(args, flag[2:].replace("-", "_")), flag) for flag in GRANT_FLAGS}
    dsn = database_url()
    applied = migrate(
        dsn,
        grant=grants["--grant"],
        grant_worker=grants["--grant-worker"],
        grant_enqueue=grants["--grant-enqueue"],
        grant_read=grants["--grant-read"],
    )
    print(f"applied {len(applied)} migration(s)" + (f": {applied}" if applied else ""))
    newer = unknown(dsn)
    if newer:
        print(f"note: {NEWER.format(newer)}")
    if args.key_index:
        changed = use_key_index(dsn, args.key_index)
        print(
            f"idempotency keys: {describe_key_index(args.key_index)}"
            + (" (switched)" if changed else " (already)")
        )
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = parse_json(args.payload)
    run_at = parse_instant(args.run_at, "--run-at") if args.run_at is not None else None
    max_bytes = option_or_env(args.max_payload_bytes, "ROTA_MAX_PAYLOAD_BYTES", positive_int)
    settings = QueueSettings(max_payload_bytes=max_bytes or QueueSettings().max_payload_bytes)
    job_id = enqueue(
        database_url(),
        args.type,
        payload,
        key=args.key,
        run_at=run_at,
        delay=args.delay,
        max_attempts=args.max_attempts,
        priority=args.priority,
        timeout=args.timeout,
        group=args.group,
        unique_for=args.unique_for,
        unique_active=args.unique_active,
        settings=settings,
    )
    print(job_id)
    return 0


def _types(args: argparse.Namespace) -> list[str] | None:
    if args.types and args.all:
        raise UsageError(f"give job types or --all, not both: rota {args.command} TYPE... | --all")
    if not args.types and not args.all:
        raise UsageError(f"give job types or --all: rota {args.command} TYPE... | --all")
    if any(t.strip() == control.ALL_TYPES for t in args.types):
        raise UsageError(f"not a job type: {control.ALL_TYPES!r} (to mean every type, say --all)")
    return None if args.all else args.types


def cmd_pause(args: argparse.Namespace) -> int:
    types = _types(args)
    control.pause(database_url(), types)
    print(shown(f"paused: {', '.join(types) if types else 'every type'}"))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    types = _types(args)
    control.resume(database_url(), types)
    print(shown(f"resumed: {', '.join(types) if types else 'every type'}"))
    if types and control.ALL_TYPES in control.paused(database_url()):
        print("note: every type is still paused (rota resume --all lifts that)")
    return 0
