"""What `rota` says when a command fails, and with which exit code.

DESIGN.md section 5: 2 for bad usage or input (an unknown job id or schedule
name included), 1 for a runtime error. Either way one line on stderr that
says what to do, never a traceback (`rota -v` adds it for an unexpected one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import psycopg
from psycopg.conninfo import conninfo_to_dict

from rota.cli.common import UsageError
from rota.errors import (
    ConnectionOptionRefused,
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    JobNotFound,
    RotaError,
    one_line,
)

BAD_INPUT = 2
RUNTIME = 1

_NO_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InvalidSchemaName,
)
"""What a statement meets in a database that `rota migrate` has not brought up to date."""


def explain(exc: BaseException, argv: Sequence[str]) -> tuple[int, str] | None:
    """The exit code and the line to print for `exc`, or None if it is not Rota's."""
    if isinstance(exc, ConnectionOptionRefused):
        source = _option_source(exc.option)
        return BAD_INPUT, f"error: {source} has a connection option libpq refuses: {exc.reason}"
    if isinstance(exc, UsageError | InvalidInput | JobNotFound):
        return BAD_INPUT, f"error: {one_line(exc)}{_dash_hint(str(exc), argv)}"
    if isinstance(exc, DatabaseUnavailable):
        return RUNTIME, _unavailable(exc)
    if isinstance(exc, DatabaseError) and isinstance(exc.__cause__, _NO_SCHEMA):
        return RUNTIME, (
            "the database has no Rota schema, or an older one: run `rota migrate`"
            f" ({str(exc.__cause__).splitlines()[0]})"
        )
    if isinstance(exc, RotaError):
        return RUNTIME, one_line(exc)
    return None


def _option_source(option: str | None) -> str:
    """Where the refused `option` was given: its PG* variable when that is set and
    ROTA_DATABASE_URL does not give the option itself (the Helm chart sets
    PGSSLMODE beside the URL); else the URL, or the PG* variables without one."""
    url = os.environ.get("ROTA_DATABASE_URL", "")
    if option and option not in (conninfo_to_dict(url) if url else {}):
        for default in psycopg.pq.Conninfo.get_defaults():
            variable = (default.envvar or b"").decode()
            if default.keyword.decode() == option and variable and os.environ.get(variable):
                return variable
    return "ROTA_DATABASE_URL" if url else "a PG* variable"


def _unavailable(exc: DatabaseUnavailable) -> str:
    reason = one_line(exc).removeprefix("database unavailable: ")
    if getattr(exc.__cause__, "sqlstate", None) == "25006":
        # Reached, but read-only: a standby, a primary fenced in a failover, or
        # default_transaction_read_only. A worker waits for it as for an outage.
        return f"the database takes no writes now (a standby, or read-only): {reason}"
    if os.environ.get("ROTA_DATABASE_URL"):
        return f"cannot reach the database of ROTA_DATABASE_URL: {reason}"
    return (
        "cannot reach a database: ROTA_DATABASE_URL is not set, so libpq's defaults"
        f" were tried (the PG* variables, or a local socket): {reason}"
    )


_EXPECTED_ONE = re.compile(r"argument (\S+): expected one argument")


def _dash_hint(message: str, argv: Sequence[str]) -> str:
    """argparse takes `--older-than -1d` for two options; say how to pass such a value."""
    found = _EXPECTED_ONE.search(message)
    if not found:
        return ""
    options = found.group(1).split("/")
    for i, word in enumerate(argv[:-1]):
        if word in options and argv[i + 1].startswith("-"):
            return f" (a value that starts with '-' is written {word}={argv[i + 1]})"
    return ""
