"""Settings of the core queue, as dataclasses with their units and reasons.

Only the CLI and the ``__main__`` modules read environment variables; everything
else receives one of these.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from rota import limits
from rota.errors import InvalidInput


@dataclasses.dataclass(frozen=True)
class QueueSettings:
    default_max_attempts: int = 20
    """Attempts a job gets when it does not say (River and Oban use 20/25): with the
    default backoff that spans about a day before the job is declared dead."""

    max_payload_bytes: int = limits.MAX_PAYLOAD_BYTES
    """Largest JSON payload accepted, in bytes. Jobs carry references, not documents;
    large payloads bloat the table every claim walks."""

    def __post_init__(self) -> None:
        limits.whole(self.default_max_attempts, "default_max_attempts")
        # The database's limit is a ceiling: past it, Python would pass a payload
        # that the database refuses inside the caller's transaction.
        limits.whole(self.max_payload_bytes, "max_payload_bytes", 2, limits.MAX_PAYLOAD_BYTES)


@dataclasses.dataclass(frozen=True)
class BackoffSettings:
    base_seconds: float = 1.0
    """Delay before the first retry, in seconds; doubled for every further attempt."""

    cap_seconds: float = 3600.0
    """No retry waits longer than this, in seconds, however many attempts came before."""

    jitter: float = 0.25
    """Fraction of the delay drawn at random (+/-), so jobs that failed together do
    not all come back in the same instant."""

    def __post_init__(self) -> None:
        if self.base_seconds < 0 or self.cap_seconds < self.base_seconds:
            raise InvalidInput("backoff needs 0 <= base_seconds <= cap_seconds")
        if not 0 <= self.jitter <= 1:
            raise InvalidInput("backoff jitter must be between 0 and 1")


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    """How the long-lived connections of Rota's own processes (workers and their
    services) are opened: their timeouts, and whether psycopg prepares statements
    on them; none of this applies to the connections handlers open."""

    connect_timeout_seconds: int = 5
    """libpq's ``connect_timeout``: the longest a connection attempt waits for a
    host that does not answer (whole seconds, at least 2); Rota retries with backoff."""

    keepalives_idle_seconds: int = 10
    """TCP keepalives: seconds of silence on a connection before the first probe."""

    keepalives_interval_seconds: int = 5
    """TCP keepalives: seconds between unanswered probes."""

    keepalives_count: int = 3
    """TCP keepalives: unanswered probes before the kernel drops the connection, so
    an idle connection to a vanished host is noticed within idle + count x interval
    seconds (25 s by default)."""

    tcp_user_timeout_seconds: float = 20.0
    """TCP_USER_TIMEOUT: the longest data sent may stay unacknowledged before the
    kernel drops the connection (a host gone while a statement is sent)."""

    statement_timeout_seconds: float | None = 30.0
    """``statement_timeout`` of the worker's and services' own statements (claims,
    outcomes, heartbeats, the reaper, the scheduler, the archive): a statement stuck
    behind a lock is refused, logged and tried again. None: the server's setting.
    Sent as a startup option; a pooler that drops startup options drops it."""

    lock_timeout_seconds: float = 2.0
    """``lock_timeout`` of the heartbeat statement: a lease row locked by a handler's
    own transaction is not waited for; the heartbeat renews the others one at a time."""

    answer_timeout_seconds: float = 40.0
    """The longest the worker waits for the answer to one of its statements before it
    takes the connection for dead and opens a new one: a connection the network
    silently stopped carrying (a half-open socket after a failover, a proxy that
    stopped forwarding) answers nothing, and neither the statement timeout nor the
    keepalives end that wait. A claim that waits for a NOTIFY gets the poll interval
    on top."""

    prepared_statements: bool = True
    """Let psycopg prepare a statement on its sixth run (its ``prepare_threshold``),
    so that the server parses and plans it once per connection. False: never
    prepare, for a pooler in transaction mode that does not keep track of prepared
    statements (PgBouncer before 1.21, or later without ``max_prepared_statements``),
    where the next transaction may reach a server connection without the
    statement, or one holding another client's statement of the same name."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _CONNECTION_RANGES and value is not None:
                # only statement_timeout_seconds may be None
                self.check(field.name, value, field.name)

    @staticmethod
    def check(name: str, value: Any, what: str) -> Any:
        """`value` for the setting `name`, or `InvalidInput` naming it as `what`:
        the ranges libpq, the kernel and PostgreSQL take (the CLI checks its
        options and environment variables with this too)."""
        return _CONNECTION_RANGES[name](value, what)

    def preparing(self) -> dict[str, Any]:
        """psycopg's ``prepare_threshold`` (None: never prepare) without prepared
        statements; nothing (psycopg's default) with them."""
        return {} if self.prepared_statements else {"prepare_threshold": None}

    def libpq(self, dsn: str, *, lock_timeout: bool = False) -> dict[str, Any]:
        """Connection keywords for `rota.db.connect`: the timeouts, with the server
        settings added to the ``options`` the URL may already carry, and psycopg's
        ``prepare_threshold`` (None: never prepare) without prepared statements."""
        options = [str(conninfo_to_dict(dsn).get("options") or "")]
        if self.statement_timeout_seconds is not None:
            options.append(f"-c statement_timeout={_ms(self.statement_timeout_seconds)}")
        if lock_timeout:
            options.append(f"-c lock_timeout={_ms(self.lock_timeout_seconds)}")
        return {
            **self.preparing(),
            "connect_timeout": self.connect_timeout_seconds,
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle_seconds,
            "keepalives_interval": self.keepalives_interval_seconds,
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": _ms(self.tcp_user_timeout_seconds),
            "options": " ".join(o for o in options if o),
        }


_KEEPALIVE = functools.partial(limits.whole, minimum=1, maximum=limits.MAX_KEEPALIVE_SECONDS)
_MILLISECONDS = functools.partial(
    limits.seconds_within, least=0.001, most=limits.MAX_MILLISECONDS_TIMEOUT
)
_CONNECTION_RANGES: dict[str, Callable[[Any, str], Any]] = {
    # libpq refuses less than 2 seconds (it makes 2 of them).
    "connect_timeout_seconds": functools.partial(limits.whole, minimum=2),
    "keepalives_idle_seconds": _KEEPALIVE,
    "keepalives_interval_seconds": _KEEPALIVE,
    "keepalives_count": functools.partial(
        limits.whole, minimum=1, maximum=limits.MAX_KEEPALIVE_PROBES
    ),
    "tcp_user_timeout_seconds": _MILLISECONDS,
    "statement_timeout_seconds": _MILLISECONDS,
    "lock_timeout_seconds": _MILLISECONDS,
    # The watchdog looks four times a deadline (at most every 0.25 s), and a
    # service waits for notifications in half-second steps, each under it.
    "answer_timeout_seconds": functools.partial(limits.seconds_within, least=1),
}


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
