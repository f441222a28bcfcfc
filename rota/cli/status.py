"""`rota status`: the queue's measures per job type, with warnings, for people and scripts.

It shows the same database measures the Prometheus collector serves
(`rota.status.read_status`), so what a person reads in a terminal and what an
alert fires on never disagree. It only reads; it never changes a row.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from rota.cli.common import (
    UsageError,
    database_url,
    json_text,
    non_negative_int,
    parse_duration,
    print_json,
)
from rota.errors import MigrationError
from rota.migrate import describe_key_index, key_index
from rota.status import read_status, render, warnings

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
        type=non_negative_int,
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

    def snapshot() -> dict[str, Any] | str:
        """The JSON document, or the text, of the status now."""
        status = read_status(dsn)
        found = warnings(status, max_age, args.max_lease_expirations)
        try:
            keys: str | None = key_index(dsn)
        except MigrationError as exc:  # no unique index on the key: a switch went wrong
            keys = None
            found.append(str(exc))
        if args.json:
            return {**status.to_json(), "key_index": keys, "warnings": found}
        return render(status, found, describe_key_index(keys) if keys else "none")

    if args.watch is None:
        view = snapshot()
        if isinstance(view, str):
            print(view, end="")
        else:
            print_json(view)
        return 0
    return watch(snapshot, args.watch, as_json=args.json)


def watch(
    snapshot: Callable[[], dict[str, Any] | str],
    interval: float,
    *,
    as_json: bool,
    rounds: int | None = None,
) -> int:
    """Redraw the status every `interval` seconds (JSON: one document per line)."""
    done = 0
    try:
        while rounds is None or done < rounds:
            view = snapshot()
            if as_json:
                print(json_text(view), flush=True)
            else:
                sys.stdout.write(f"{_CLEAR}{view}\nEvery {interval:g}s; Ctrl-C stops.\n")
                sys.stdout.flush()
            done += 1
            if rounds is None or done < rounds:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    return 0
