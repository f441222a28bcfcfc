"""`rota limit set`, `rota limit clear` and `rota limit list`."""

from __future__ import annotations

import argparse
from typing import Any

from rota import flow
from rota.cli.common import UsageError, database_url, decimal, positive_int, print_json, table
from rota.reading import shown


def register(sub: Any) -> None:
    p = sub.add_parser("limit", help="limits per job type that bind every worker")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", parser_class=type(p))
    verbs.required = True

    s = verbs.add_parser("set", help="set a type's limits (replacing those it had)")
    s.add_argument("type")
    s.add_argument("--concurrency", type=positive_int, metavar="N", help="at most N running")
    s.add_argument(
        "--group-concurrency", type=positive_int, metavar="N", help="at most N running per group"
    )
    s.add_argument("--rate", type=positive_int, metavar="N", help="at most N starts per --per")
    s.add_argument("--per", type=decimal, metavar="SECONDS", help="the window of --rate")
    s.set_defaults(func=cmd_set)

    c = verbs.add_parser("clear", help="remove every limit of a type")
    c.add_argument("type")
    c.set_defaults(func=cmd_clear)

    ls = verbs.add_parser("list", help="the limits, and how many due jobs each holds back")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=cmd_list)


def cmd_set(args: argparse.Namespace) -> int:
    if all(v is None for v in (args.concurrency, args.group_concurrency, args.rate, args.per)):
        raise UsageError(
            "give a limit: --concurrency N, --group-concurrency N, or --rate N with --per"
            f" SECONDS (`rota limit clear {args.type}` removes the type's limits)"
        )
    if (args.rate is None) != (args.per is None):
        raise UsageError("give --rate and --per together: at most N starts per SECONDS")
    flow.set_limit(
        database_url(),
        args.type,
        concurrency=args.concurrency,
        group_concurrency=args.group_concurrency,
        rate=args.rate,
        per=args.per,
    )
    [limit] = flow.list_limits(database_url(), types=[args.type])
    print(shown(f"{args.type}: {limit.describe()}"))
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    cleared = flow.clear_limit(database_url(), args.type)
    print(shown(f"{args.type}: " + ("limits cleared" if cleared else "had no limits")))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    limits = flow.list_limits(database_url())
    if args.json:
        print_json([lim.to_json() for lim in limits])
        return 0
    if not limits:
        print("No limits.")
        return 0
    print(render(limits), end="")
    return 0


def render(limits: list[flow.Limit]) -> str:
    rows = [("TYPE", "LIMITS", "RUNNING", "DUE", "HELD BACK", "STATE")]
    for lim in limits:
        rows.append(
            (
                lim.type,
                lim.describe(),
                str(lim.running),
                str(lim.due),
                str(lim.held),
                "LIMITED" if lim.limited else "-",
            )
        )
    return table(rows)
