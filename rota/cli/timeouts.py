"""How a long-running command's own connections are opened, as options.

`rota worker`, `rota reaper`, `rota scheduler` and `rota archive` take the
fields of `rota.settings.ConnectionSettings` as options (``--statement-timeout
SECONDS``), each also read from an environment variable named after its field
(``ROTA_STATEMENT_TIMEOUT_SECONDS``) when the option is not given: a Deployment
sets them once for every container. The option wins over the variable. Both
are checked by `ConnectionSettings.check`, so a value libpq, the kernel or
PostgreSQL would refuse at connection time is bad input before anything runs,
said in one line that names the option or the variable. Prepared statements
are on unless ``--no-prepared-statements`` or ``ROTA_PREPARED_STATEMENTS=off``.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from typing import Any

from rota.cli.common import UsageError, checked, whole_number
from rota.errors import InvalidInput
from rota.settings import ConnectionSettings

OPTIONS: tuple[tuple[str, str, type, str], ...] = (
    (
        "connect_timeout_seconds",
        "--connect-timeout",
        int,
        "longest wait for a connection attempt (libpq connect_timeout), whole seconds from 2",
    ),
    (
        "keepalives_idle_seconds",
        "--keepalives-idle",
        int,
        "whole seconds of silence on a connection before the first TCP keepalive probe",
    ),
    (
        "keepalives_interval_seconds",
        "--keepalives-interval",
        int,
        "whole seconds between unanswered TCP keepalive probes",
    ),
    (
        "keepalives_count",
        "--keepalives-count",
        int,
        "unanswered TCP keepalive probes, 1 to 127, before the connection is dropped",
    ),
    (
        "tcp_user_timeout_seconds",
        "--tcp-user-timeout",
        float,
        "longest data sent may stay unacknowledged before the connection is dropped",
    ),
    (
        "statement_timeout_seconds",
        "--statement-timeout",
        float,
        "statement_timeout of Rota's own statements; 0 leaves the server's setting",
    ),
    (
        "lock_timeout_seconds",
        "--lock-timeout",
        float,
        "lock_timeout of the heartbeat: a lease row locked by someone is not waited for",
    ),
    (
        "answer_timeout_seconds",
        "--answer-timeout",
        float,
        "longest wait for an answer, at least 1, before a connection is taken for dead",
    ),
)
"""(ConnectionSettings field, option, type, help) of each connection option."""

NONE = "statement_timeout_seconds"
"""The setting whose 0 means None: no statement timeout sent, the server's applies."""

PREPARED = "prepared_statements"
"""The setting of ``--no-prepared-statements``, and of ``ROTA_PREPARED_STATEMENTS``."""

_SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def env_name(field: str) -> str:
    """The environment variable of a setting: ROTA_ and its field's name."""
    return f"ROTA_{field.upper()}"


def add_options(parser: argparse.ArgumentParser, *, heartbeat: bool = False) -> None:
    """Add the connection options to `parser` (`--lock-timeout` only with
    `heartbeat`: only a worker's heartbeat sets a lock timeout)."""
    defaults = ConnectionSettings()
    for field, option, kind, text in OPTIONS:
        if field == "lock_timeout_seconds" and not heartbeat:
            continue
        parser.add_argument(
            option,
            dest=field,
            type=_parser(field, kind),
            metavar="N" if field == "keepalives_count" else "SECONDS",
            help=f"{text} (default: {env_name(field)} or {getattr(defaults, field):g})",
        )
    parser.add_argument(
        "--no-prepared-statements",
        dest=PREPARED,
        action="store_const",
        const=False,
        help="never let psycopg prepare statements: for a pooler in transaction mode that"
        " does not track them, such as PgBouncer 1.18 (default: ROTA_PREPARED_STATEMENTS,"
        " on or off; on when unset)",
    )


def settings(args: argparse.Namespace) -> ConnectionSettings:
    """The connection settings the options (or their environment variables) give."""
    values: dict[str, Any] = {}
    for field, _, kind, _ in OPTIONS:
        if not hasattr(args, field):
            continue
        value = option_or_env(getattr(args, field), env_name(field), _parser(field, kind))
        if value is not None:
            values[field] = None if field == NONE and value == 0 else value
    if hasattr(args, PREPARED):
        prepared = option_or_env(getattr(args, PREPARED), env_name(PREPARED), _switch)
        if prepared is not None:
            values[PREPARED] = prepared
    return ConnectionSettings(**values)


def _switch(text: str) -> bool:
    try:
        return _SWITCH[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"on or off, not {text!r}") from None


def option_or_env(value: Any, env: str, parse: Callable[[str], Any]) -> Any:
    """The option's value if given, else `env` read with `parse` (None when unset);
    a bad value in `env` is bad input that names it."""
    if value is not None:
        return value
    text = os.environ.get(env, "").strip()
    if not text:
        return None
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{env}: {exc}") from None


def _parser(field: str, kind: type) -> Callable[[str], Any]:
    check = functools.partial(ConnectionSettings.check, field)
    convert = whole_number if kind is int else kind
    if field != NONE:
        return checked(convert, check)

    def zero_or_checked(value: float, what: str) -> object:
        if value == 0:
            return None
        try:
            return check(value, what)
        except InvalidInput as exc:
            raise InvalidInput(f"{exc} (or 0: the server's setting)") from None

    return checked(convert, zero_or_checked)
