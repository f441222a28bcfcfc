"""`rota status`: the queue's measures per job type, with warnings, for people and scripts.

It shows the same database measures the Prometheus collector serves
(`rota.metrics.read_status`), so what a person reads in a terminal and what an
alert fires on never disagree. It only reads; it never changes a row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rota.cli.common import UsageError, database_url, parse_duration, print_json
from rota.metrics import read_status

_COLUMNS = ("TYPE", "READY", "DUE", "OLDEST READY", "RUNNING", "DONE", "FAILED", "DEAD")
_CLEAR = "\033[H\033[J"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("status", help="the queue's measures per job type, with warnings")
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    parser.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_interval,
        metavar="SECONDS",
        help="refresh in place every SECONDS (default 2) until Ctrl-C",
    )
    parser.add_argument(
        "--max-age",
        default="5m",
        metavar="DURATION",
        help="warn when a type's oldest ready job has waited longer (default 5m)",
    )
    parser.add_argument(
        "--max-lease-expirations",
        type=int,
        default=10,
        metavar="N",
        help="warn when N or more leases expired in the current or the previous hour (default 10)",
    )
    parser.set_defaults(func=run)


def _interval(text: str) -> float:
    seconds = parse_duration(text, "--watch")
    if seconds <= 0:
        raise UsageError(f"--watch must be more than 0 seconds: {text!r}")
    return seconds


def run(args: argparse.Namespace) -> int:
    max_age = parse_duration(args.max_age, "--max-age")
    dsn = database_url()

    def snapshot() -> dict[str, Any]:
        status = read_status(dsn)
        status["warnings"] = warnings(status, max_age, args.max_lease_expirations)
        return status

    if args.watch is None:
        status = snapshot()
        if args.json:
            print_json(status)
        else:
            print(render(status), end="")
        return 0
    return watch(snapshot, args.watch, as_json=args.json)


def watch(
    snapshot: Callable[[], dict[str, Any]],
    interval: float,
    *,
    as_json: bool,
    rounds: int | None = None,
) -> int:
    """Redraw the status every `interval` seconds (JSON: one document per line)."""
    done = 0
    try:
        while rounds is None or done < rounds:
            status = snapshot()
            if as_json:
                print(json.dumps(status, sort_keys=True, default=str), flush=True)
            else:
                sys.stdout.write(
                    _CLEAR + render(status) + f"\nEvery {interval:g}s; Ctrl-C stops.\n"
                )
                sys.stdout.flush()
            done += 1
            if rounds is None or done < rounds:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    return 0


def warnings(
    status: dict[str, Any], max_age_seconds: float, max_lease_expirations: int
) -> list[str]:
    """What deserves a person's attention in these measures, one sentence each."""
    found = []
    for job_type, measures in status["types"].items():
        age = measures["oldest_ready_age_seconds"]
        if age > max_age_seconds:
            found.append(
                f"{job_type}: the oldest ready job has waited {format_age(age)}"
                f" (more than {format_age(max_age_seconds)}): too few workers?"
            )
    leases = status["lease_expirations"]
    worst = max(leases["current_hour"], leases["previous_hour"])
    if worst >= max_lease_expirations:
        found.append(
            f"{worst} leases expired within one hour (threshold {max_lease_expirations}):"
            " workers are dying or handlers outlive their lease"
        )
    if status["dead_jobs"]:
        found.append(
            f"{status['dead_jobs']} dead job(s): `rota dead list` shows them,"
            " `rota dead retry` runs them again"
        )
    return found


def format_age(seconds: float) -> str:
    """1h02m, 4m05s, 12s: short enough for a table column."""
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{seconds:.0f}s"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "".join(line.rstrip() + "\n" for line in lines)


def _seconds(instant: str) -> str:
    return datetime.fromisoformat(instant).isoformat(timespec="seconds")


def _type_rows(status: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for job_type, m in status["types"].items():
        rows.append(
            (
                job_type,
                str(m["ready"]),
                str(m["due"]),
                format_age(m["oldest_ready_age_seconds"]) if m["due"] else "-",
                str(m["running"]),
                str(m["done"]),
                str(m["failed"]),
                str(m["dead"]),
            )
        )
    return rows


def _schedule_rows(status: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("SCHEDULE", "TYPE", "MISSED", "SKIPPED", "NEXT RUN")]
    for s in status["schedules"]:
        next_run = "suspended" if s["suspend"] else _seconds(s["next_run_at"])
        rows.append(
            (s["name"], s["job_type"], str(s["missed_slots"]), str(s["skipped_slots"]), next_run)
        )
    return rows


def render(status: dict[str, Any]) -> str:
    """The status as text: a table per type, lease expirations, schedules, warnings."""
    parts = [f"Rota status at {status['now']}\n\n"]
    parts.append(_table(_type_rows(status)) if status["types"] else "No jobs.\n")
    leases = status["lease_expirations"]
    parts.append(
        f"\nLease expirations: {leases['current_hour']} this hour, "
        f"{leases['previous_hour']} the hour before, {leases['last_24h']} in 24 h, "
        f"{leases['total']} in all\n"
    )
    if status["schedules"]:
        parts.append("\n" + _table(_schedule_rows(status)))
    found = status.get("warnings", [])
    parts.append(
        "\nWarnings:\n" + "".join(f"  ! {w}\n" for w in found) if found else "\nNo warnings.\n"
    )
    return "".join(parts)
