"""`rota web`: serve the web console.

The console's token comes from ROTA_WEB_TOKEN (sent as ``Authorization:
Bearer <token>``, or typed once into the login page for a session cookie);
ROTA_WEB_SECRET, when set, signs sessions and CSRF values instead of a key
derived from the token (replicas behind one address need the same secret).
An auth proxy can vouch for users instead: its header is honoured only from
the addresses given with --proxy-from; --operator names users and
--operator-group names groups that may act. Behind a TLS-terminating proxy,
--forwarded-from trusts its X-Forwarded-Proto so that cookies are Secure.
A connection option libpq refuses is bad input, exit 2 before serving; a
database away at start is waited for while serving.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

from rota.cli.common import UsageError, address, database_url, is_utf8, whole_number
from rota.cli.exits import one_line
from rota.db import check_options
from rota.errors import RotaError

if TYPE_CHECKING:
    from rota.web import WebSettings

log = logging.getLogger("rota.web")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("web", help="serve the web console")
    parser.add_argument(
        "--host", type=address, default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=_port, default=8080, help="port to listen on (default 8080)")
    parser.add_argument(
        "--read-only", action="store_true", help="show everything, hide and refuse every action"
    )
    parser.add_argument(
        "--proxy-header",
        type=_header,
        metavar="HEADER",
        help="header with the user's name (e.g. X-Forwarded-User), trusted from --proxy-from only",
    )
    parser.add_argument(
        "--proxy-groups-header",
        type=_header,
        metavar="HEADER",
        help="header with the user's groups, comma-separated (e.g. X-Forwarded-Groups)",
    )
    parser.add_argument(
        "--proxy-from",
        action="append",
        default=[],
        metavar="CIDR",
        help="address or network the auth proxy connects from (repeatable)",
    )
    parser.add_argument(
        "--operator",
        action="append",
        type=_name,
        default=[],
        metavar="USER",
        help="proxy user that may act (repeatable); other proxy users only look",
    )
    parser.add_argument(
        "--operator-group",
        action="append",
        type=_name,
        default=[],
        metavar="GROUP",
        help="proxy group whose members may act (repeatable; from --proxy-groups-header)",
    )
    parser.add_argument(
        "--forwarded-from",
        action="append",
        default=[],
        metavar="CIDR",
        help="address or network of a TLS-terminating proxy whose X-Forwarded-Proto is"
        " trusted, for Secure cookies (repeatable; --proxy-from addresses are trusted too)",
    )
    parser.set_defaults(func=run)


def _port(text: str) -> int:
    try:
        value = whole_number(text)
    except argparse.ArgumentTypeError:
        raise UsageError(f"--port is not a whole number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise UsageError(f"--port must be from 1 to 65535, not {value}")
    return value


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header's name (RFC 9110's token): anything else never arrives as one."""


def _header(text: str) -> str:
    """argparse type: a header name an auth proxy can set."""
    if not _TOKEN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"must be an HTTP header name such as X-Forwarded-User, not {text!r}"
        )
    return text


def _name(text: str) -> str:
    """argparse type: a proxy user's or group's name, never blank (no user is named so)."""
    if not text.strip() or not is_utf8(text):
        raise argparse.ArgumentTypeError(f"must be a non-blank name in UTF-8, not {text!r}")
    return text


def _variable(name: str) -> str:
    """An environment variable of the console ("" when unset), in UTF-8 (it is not
    repeated: it is a secret)."""
    value = os.environ.get(name, "")
    if not is_utf8(value):
        raise UsageError(f"{name} is not valid UTF-8")
    return value


def _token() -> str | None:
    token = _variable("ROTA_WEB_TOKEN")
    if token and not token.strip():
        raise UsageError(
            "ROTA_WEB_TOKEN is blank: set a token, or unset it (anybody may look, nobody may act)"
        )
    return token or None


def settings_from(args: argparse.Namespace) -> WebSettings:
    """The console's settings from the arguments and the environment."""
    try:
        from rota.web import AuthSettings, WebSettings
    except ImportError as exc:
        raise UsageError(
            f"the web console needs the 'web' extra: pip install 'rota[web]' ({exc})"
        ) from None
    if args.proxy_header and not args.proxy_from:
        raise UsageError("--proxy-header needs --proxy-from: the addresses of the auth proxy")
    secret = _variable("ROTA_WEB_SECRET").encode()
    token = _token()
    try:
        auth = AuthSettings(
            token=token,
            secret=secret,
            proxy_header=args.proxy_header,
            proxy_groups_header=args.proxy_groups_header,
            proxy_addresses=tuple(args.proxy_from),
            operators=frozenset(args.operator),
            operator_groups=frozenset(args.operator_group),
            forwarded_addresses=tuple(args.forwarded_from),
        )
    except ValueError as exc:
        raise UsageError(f"--proxy-from/--forwarded-from: {exc}") from None
    if args.operator_group and not args.proxy_groups_header:
        raise UsageError("--operator-group needs --proxy-groups-header: where the groups come from")
    return WebSettings(dsn=database_url(), auth=auth, read_only=args.read_only)


def _check_address(host: str, port: int) -> None:
    """Take the address once before uvicorn does, so that one that cannot be had (the
    port taken, a host not this one) is said in one line, and nothing started."""
    from rota.metrics import cannot_listen  # as the other servers say it

    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            probe.bind(where)
    except OSError as exc:
        raise cannot_listen("the console", host, port, exc, "--port or --host") from None


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    _check_address(args.host, args.port)
    if failure := check_options(settings.dsn):
        # The pool keeps trying: pages answer once the database does.
        log.warning("waiting for the database (%s); serving meanwhile", one_line(failure))
    import uvicorn

    from rota.web import create_app

    app = create_app(settings)
    if not settings.auth.configured:
        log.warning("no ROTA_WEB_TOKEN and no auth proxy: anybody may look, nobody may act")
    print(f"Rota console on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    # The socket's peer is the client: forwarded-for headers are not trusted.
    try:
        with _stops_taken():
            uvicorn.run(
                app, host=args.host, port=args.port, proxy_headers=False, log_level="warning"
            )
    except SystemExit as exc:
        if exc.code == 0:
            return 0
        if exc.code != UVICORN_STARTUP_FAILURE:
            raise
        # uvicorn said why on the line before (the address is in use, say): exit 1.
        raise RotaError(
            f"the console could not listen on {args.host}:{args.port}:"
            " choose another --port (or --host)"
        ) from None
    return 0


@contextlib.contextmanager
def _stops_taken() -> Iterator[None]:
    """uvicorn stops cleanly on SIGTERM or SIGINT, then raises the signal again once
    it has put back the handlers it found, to end the process as the signal
    would (143 for SIGTERM). The handlers it finds are these, which end the
    process with 0, as every other command after a clean stop (and, before
    uvicorn takes the signals, end it at once: nothing was served yet)."""
    stops = (signal.SIGTERM, signal.SIGINT)
    found = {sig: signal.signal(sig, _stopped) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in found.items():
            signal.signal(sig, handler)


def _stopped(sig: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


UVICORN_STARTUP_FAILURE = 3
"""uvicorn's exit code when it cannot start (it cannot bind the address)."""
