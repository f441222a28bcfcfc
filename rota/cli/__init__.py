"""The `rota` command line: one module per group of subcommands.

Each module has ``register(subparsers)``, which adds its commands with
``set_defaults(func=...)``; a command function takes the parsed arguments and
returns the exit code. `main` turns `UsageError`/`InvalidInput` into exit 2 with
a one-line reason and any other `RotaError` into exit 1.

Commands that live outside the core (`rota worker` and `rota demo`, from the
worker package) come in through the ``rota.commands`` entry point group: each
entry is a ``register(subparsers)`` function, so the core never imports them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence

from rota import logs
from rota.cli.common import UsageError
from rota.errors import InvalidInput, RotaError

# Subcommand modules, in the order `rota --help` lists them.
_MODULES = [
    "rota.cli.queue",  # migrate, enqueue, pause, resume
    "rota.cli.jobs",  # jobs ..., dead ...
    "rota.cli.services",  # reaper, scheduler, archive
    "rota.cli.schedule",  # schedule ...
    "rota.cli.status",  # status
    "rota.cli.exporter",  # exporter
    "rota.cli.web",  # web
]
PLUGIN_GROUP = "rota.commands"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rota", description="Jobs and schedules on PostgreSQL.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("ROTA_LOG_FORMAT", "text"),
        help="log lines as text or as JSON objects (default: ROTA_LOG_FORMAT or text)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _MODULES:
        importlib.import_module(name).register(sub)
    for entry in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        entry.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logs.configure(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
        return int(args.func(args) or 0)
    except (UsageError, InvalidInput) as exc:
        print(f"rota: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except RotaError as exc:
        print(f"rota: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _one_line(exc: BaseException) -> str:
    return " ".join(part.strip() for part in str(exc).splitlines() if part.strip())


def run() -> None:
    sys.exit(main())
