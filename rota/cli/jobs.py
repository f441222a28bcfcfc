"""`rota jobs ...` (list, show, cancel) and `rota dead ...` (the dead-letter list)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime
from typing import Any

from psycopg.types.string import TextLoader

from rota import control, db, durable, limits, lookup
from rota.cli.common import UsageError, database_url, positive_int, print_json, shown, table
from rota.jobs import Job, Status
from rota.reading import json_of


def register(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="list, show or cancel jobs").add_subparsers(
        dest="jobs_command", metavar="COMMAND", required=True
    )
    p = jobs.add_parser("list", help="the newest jobs, filtered")
    p.add_argument("--status")
    p.add_argument("--type")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs_list)
    p = jobs.add_parser("show", help="one job's whole row (an archived job's from the archive)")
    p.add_argument("id", type=_job_id)
    p.add_argument("--json", action="store_true", help="the row as one JSON object")
    p.set_defaults(func=cmd_jobs_show)
    p = jobs.add_parser(
        "cancel", help="cancel jobs: ready and waiting ones at once, running ones asked"
    )
    p.add_argument("ids", nargs="*", type=_job_id, metavar="ID")
    p.add_argument("--type", help="every ready, waiting and running job of this type")
    p.add_argument(
        "--status",
        choices=[Status.READY.value, Status.WAITING.value, Status.RUNNING.value],
        help="with --type",
    )
    p.set_defaults(func=cmd_jobs_cancel)

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
        return positive_int(text, limits.BIGINT_MAX)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not a job id: {text!r}") from None


_COLUMNS = ["id", "type", "status", "priority", "attempts", "run_at", "locked_by", "last_error"]


def _table(jobs: list[Job]) -> None:
    if not jobs:
        print("(no jobs)")
        return
    cells = [[_cell(getattr(job, c), c) for c in _COLUMNS] for job in jobs]
    print(table([[c.upper() for c in _COLUMNS], *cells]), end="")


def _cell(value: Any, column: str) -> str:
    """A value cut to 60 characters; of an error (a traceback) its first line only."""
    text = _value(value)
    return shown(text.partition("\n")[0] if column == "last_error" else text)[:60]


def _print(jobs: list[Job], as_json: bool) -> None:
    print_json([j.to_row() for j in jobs]) if as_json else _table(jobs)


def cmd_jobs_list(args: argparse.Namespace) -> int:
    jobs = lookup.list_jobs(
        database_url(), status=args.status, job_type=args.type, limit=args.limit
    )
    _print(jobs, args.json)
    return 0


_SHOWN_BESIDE = ("group_key", "unique_key", "parent_id", "result", "errors")
"""Columns `rota jobs show` prints after a Job's own."""

_JSON_COLUMNS = ("payload", "result", "errors", "trace_context")
"""The jsonb columns: read as the database's text, then decoded (`rota.reading.json_of`)."""


def cmd_jobs_show(args: argparse.Namespace) -> int:
    with db.connect(database_url()) as conn:
        conn.adapters.register_loader("jsonb", TextLoader)  # JSON as stored, no number rounded
        stored = lookup.job_row(conn, args.id, archived=True)
    row = stored | {name: json_of(stored[name]) for name in _JSON_COLUMNS if stored.get(name)}
    columns = Job.from_row(row).to_row() | {name: row.get(name) for name in _SHOWN_BESIDE}
    if "archived_at" in row:  # moved by the archiver: the row as it left the table
        columns["archived_at"] = row["archived_at"]
    done = durable.trail(database_url(), args.id)
    if args.json:
        print_json(columns | {k: v for k, v in dataclasses.asdict(done).items() if k != "left_out"})
    else:
        print(_described(columns, stored) + _trail(done, columns["status"]), end="")
    return 0


def _trail(done: durable.Trail, status: str) -> str:
    """A durable job's steps, waits and children, a line each (nothing for other jobs).
    A wait not ended is open while the job waits; one of a job that no longer
    waits (cancelled while it waited) was left as it was."""
    not_ended = "open" if status == "waiting" else f"not ended: job {status}"
    lines = []
    if done.steps:
        lines.append("steps:")
        lines += [
            f"  {s['name']}  attempt {s['attempt']}  {_value(s['started_at'])} .."
            f" {_value(s['finished_at'])}  {s['result_bytes'] or 0} bytes"
            for s in done.steps
        ]
    if done.waits:
        lines.append("waits:")
        lines += [
            f"  {w['name']}  until {_value(w['until'])}  since {_value(w['started_at'])}  "
            + (f"ended by {w['ended_by']} {_value(w['ended_at'])}" if w["ended_by"] else not_ended)
            for w in done.waits
        ]
    if done.children:
        lines.append("children:")
        lines += [
            f"  {c['name']}  job {c['id']}  {c['type'] or '?'}  {c['status'] or 'gone'}"
            for c in done.children
        ]
    return "".join(shown(line) + "\n" for line in lines)


_BLOCKS = ("payload", "result", "last_error")
"""Columns shown under their name when they take more than a line: a line of text each."""


def _described(row: dict[str, Any], stored: dict[str, Any]) -> str:
    """A job for people: one `name  value` line per column (times as `jobs list` shows
    them), then a long payload or result and the errors (tracebacks) as lines.

    The payload and the result are the database's text of them (`stored`), so no
    number is rounded; a long one is indented when Python reads it back exactly."""
    plain = {k: v for k, v in row.items() if k not in (*_BLOCKS, "errors", "max_attempts")}
    plain["attempts"] = f"{row['attempts']} of {row['max_attempts']}"
    blocks: dict[str, str] = {}
    for name in ("payload", "result"):
        text = stored.get(name)
        if text is None or len(text) <= 80:
            plain[name] = text
        elif json.dumps(row[name], ensure_ascii=False) == text:
            blocks[name] = json.dumps(row[name], indent=2, ensure_ascii=False)
        else:  # a number Python would round, JSON nested past Python's reach
            blocks[name] = text
    width = max(len(name) for name in plain)
    lines = [f"{name.ljust(width)}  {_value(value)}" for name, value in plain.items()]
    for name, text in blocks.items():
        lines += [f"{name}:", *(f"  {line}" for line in text.splitlines())]
    errors = row.get("errors")
    listed = errors if isinstance(errors, list) else []  # any other shape: not Rota's
    earlier = [e for e in listed if isinstance(e, dict) and e.get("error") != row.get("last_error")]
    for error in earlier:
        lines.append(f"error of attempt {error.get('attempt')} ({_value(error.get('at'))}):")
        lines += [f"  {line}" for line in str(error.get("error") or "").splitlines()]
    if errors is not None and not isinstance(errors, list):
        lines += ["errors:", f"  {_value(errors)}"]
    if row.get("last_error"):
        lines += ["last_error:", *(f"  {line}" for line in str(row["last_error"]).splitlines())]
    return "".join(shown(line) + "\n" for line in lines)


def _value(value: Any) -> str:
    """One column's value, times (datetime values, never text) to the second."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def cmd_jobs_cancel(args: argparse.Namespace) -> int:
    if args.ids and args.type is not None:
        raise UsageError("give job ids or --type, not both")
    if not args.ids and args.type is None:
        raise UsageError("give job ids or --type: rota jobs cancel ID... | --type TYPE")
    if args.type is not None and not args.type.strip():
        raise UsageError(f"--type must be a non-empty job type name, not {args.type!r}")
    if args.status and args.type is None:
        raise UsageError("--status goes with --type")
    if args.ids:
        result = control.cancel(database_url(), args.ids)
    else:
        status = Status(args.status) if args.status else None
        result = control.cancel_matching(database_url(), args.type, status)
    print(f"{len(result.ended)} job(s) cancelled" + (f": {result.ended}" if result.ended else ""))
    if result.requested:
        print(f"{len(result.requested)} running job(s) asked to stop: {result.requested}")
    left = sorted(set(args.ids) - set(result.ended) - set(result.requested))
    if left:
        print(f"already ended (left alone): {left}")
    return 0


def cmd_dead_list(args: argparse.Namespace) -> int:
    jobs = lookup.list_jobs(
        database_url(), status=Status.DEAD, job_type=args.type, limit=args.limit
    )
    _print(jobs, args.json)
    return 0


def cmd_dead_retry(args: argparse.Namespace) -> int:
    if args.ids and args.all:
        raise UsageError("give job ids or --all, not both")
    if not args.ids and not args.all:
        raise UsageError("give job ids or --all: rota dead retry ID... | --all")
    absent = control.missing(database_url(), args.ids)
    if absent:
        hint = " (`rota jobs show` reads it; enqueue it again to run it)" if absent.archived else ""
        raise UsageError(f"{absent}{hint}")
    result = control.retry_report(database_url(), args.ids, all_matching=args.all)
    revived = result.revived
    listed = revived if not args.all or len(revived) <= _LISTED else [*revived[:_LISTED], "..."]
    print(f"{len(revived)} job(s) back to ready" + (f": {listed}" if revived else ""))
    by_reason: dict[str, list[int]] = {}
    for job_id, reason in result.left.items():
        by_reason.setdefault("not dead" if reason.startswith("not ") else reason, []).append(job_id)
    for reason, ids in by_reason.items():
        print(f"{reason} (left alone): {ids}")
    return 0


_LISTED = 20
"""Ids `dead retry --all` lists of the jobs it revived (the count is always given)."""
