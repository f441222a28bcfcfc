"""The `rota` command line: one module per group of subcommands.

Each module has ``register(subparsers)``, which adds its commands with
``set_defaults(func=...)``; a command function takes the parsed arguments and
returns the exit code. `main` turns every failure into one line on stderr and
an exit code (`rota.cli.exits`): 2 for bad usage or input, 1 for the rest.

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
import traceback
from collections.abc import Sequence

import rota
from rota import logs
from rota.cli import exits
from rota.cli.common import UsageError

# Subcommand modules, in the order `rota --help` lists them.
_MODULES = [
    "rota.cli.queue",  # migrate, enqueue, pause, resume
    "rota.cli.jobs",  # jobs ..., dead ...
    "rota.cli.services",  # reaper, scheduler, archive
    "rota.cli.schedule",  # schedule ...
    "rota.cli.status",  # status
    "rota.cli.exporter",  # exporter
    "rota.cli.limit",  # limit set, clear, list
    "rota.cli.web",  # web
]
PLUGIN_GROUP = "rota.commands"
LOG_FORMATS = ("text", "json")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rota", description="Jobs and schedules on PostgreSQL.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    parser.add_argument("--version", action="version", version=f"rota {rota.__version__}")
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
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
    words = list(sys.argv[1:] if argv is None else argv)
    verbose = False
    try:
        args = build_parser().parse_args(words)
        verbose = args.verbose
        log_format = args.log_format or _log_format_variable()
        logs.configure(logging.DEBUG if args.verbose else logging.INFO, log_format)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`rota jobs list | head`): nothing more to say.
        _quiet_stdout()
        return 0
    except Exception as exc:
        explained = exits.explain(exc, words)
        if explained is None:
            if verbose:
                traceback.print_exc()
            code, line = (
                exits.RUNTIME,
                (
                    f"unexpected {type(exc).__name__}: {exits.one_line(exc)}"
                    " (`rota -v ...` prints its traceback)"
                ),
            )
        else:
            code, line = explained
        print(f"rota: {line}", file=sys.stderr)
        return code


def _log_format_variable() -> str:
    """ROTA_LOG_FORMAT (text when unset): a value that names no format is bad input,
    never text in place of the JSON a log pipeline waits for."""
    value = os.environ.get("ROTA_LOG_FORMAT", "").strip()
    if value and value not in LOG_FORMATS:
        raise UsageError(f"ROTA_LOG_FORMAT must be text or json, not {value!r}")
    return value or "text"


def _quiet_stdout() -> None:
    """Send what stdout still holds to /dev/null, so exiting does not fail on the pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run() -> None:
    code = main()
    if sys.stdout is None:  # started with stdout closed (`>&-`): print wrote nothing
        sys.exit(code)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(code)
