"""The operator's settings, read once from the environment.

The operator is started either as `rota-operator` or as `kopf run -m
rota_operator`; in both cases its configuration comes from environment
variables (a Deployment's `env:`), parsed here and nowhere else.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from rota import limits

T = TypeVar("T")

INSTANCE_LABEL = "rota.dev/instance"
"""The label that says which installation's operator owns a JobSchedule or WorkerPool."""

_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?")


class SettingsError(ValueError):
    """An environment variable the operator cannot use, named with its rule: the
    operator stops at start with this one line (exit 2), under `rota-operator`
    and `kopf run -m rota_operator` alike."""


@dataclass(frozen=True)
class Settings:
    """What the operator needs to know about its surroundings."""

    database_url: str = ""
    """ROTA_DATABASE_URL: libpq URI of Rota's database; empty uses libpq's PG* variables."""

    namespaces: tuple[str, ...] = ()
    """ROTA_NAMESPACES: comma-separated namespaces to watch; empty watches the whole cluster."""

    schedule_sync_seconds: float = 30.0
    """ROTA_SCHEDULE_SYNC_SECONDS: how often JobSchedule status is refreshed from its row."""

    poll_interval_seconds: int = 15
    """ROTA_POLL_INTERVAL_SECONDS: a WorkerPool's pollIntervalSeconds when its spec has none."""

    metrics_port: int = 8080
    """ROTA_METRICS_PORT: port of /metrics and /healthz; -1 turns the server off."""

    metrics_host: str = "0.0.0.0"
    """ROTA_METRICS_HOST: the address the metrics server listens on."""

    instance: str = ""
    """ROTA_INSTANCE: which installation this operator is. Set, it handles only the
    objects labelled rota.dev/instance=<instance>, and its finalizer, annotations and
    peering object carry the name; empty, it handles only objects without that label.
    Lower-case letters, digits and '-' (it becomes part of a DNS name)."""

    peering_name: str = "rota-operator"
    """ROTA_PEERING_NAME: the kopf peering object shared by the operator's replicas
    (default rota-operator, or rota-operator-<instance>)."""

    standalone: bool = False
    """ROTA_STANDALONE: true runs without peering (one replica only, or tests)."""

    peering_priority: int = 0
    """ROTA_PEERING_PRIORITY: this replica's peering priority; 0 picks a random one.

    kopf pauses every replica that sees another of the same priority, so replicas
    sharing a peering object need distinct priorities: the highest one acts, the
    others stand by and take over when its record expires.
    """

    retry_max_seconds: float = 300.0
    """ROTA_RETRY_MAX_SECONDS: the cap of the backoff when the database is unavailable."""

    peering_wait_log_seconds: float = 30.0
    """ROTA_PEERING_WAIT_LOG_SECONDS: while mandatory peering keeps the operator
    paused, how often it says what is missing (`rota-operator` only)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from environment variables (os.environ by default), defaults for the rest."""
        env = os.environ if environ is None else environ
        default = cls()
        instance = env.get("ROTA_INSTANCE", "").strip()
        if instance and not _PREFIX.fullmatch(instance):
            raise SettingsError(
                "ROTA_INSTANCE must be lower-case letters, digits and '-', at most 42,"
                f" starting and ending with a letter or digit, not {instance!r}"
            )
        peering = env.get("ROTA_PEERING_NAME", "") or (
            f"{default.peering_name}-{instance}" if instance else default.peering_name
        )

        def read(name: str, parse: Callable[[str], T | None], rule: str, fallback: T) -> T:
            """The variable `name` read by `parse` (None or ValueError: against `rule`);
            unset or blank, `fallback`."""
            text = env.get(name, "").strip()
            if not text:
                return fallback
            try:
                value: T | None = parse(text)
            except ValueError:
                value = None
            if value is None:
                raise SettingsError(f"{name} must be {rule}, not {env[name]!r}")
            return value

        return cls(
            database_url=env.get("ROTA_DATABASE_URL", default.database_url),
            instance=instance,
            namespaces=_names(env.get("ROTA_NAMESPACES", "")),
            schedule_sync_seconds=read(
                "ROTA_SCHEDULE_SYNC_SECONDS", _seconds, _SECONDS, default.schedule_sync_seconds
            ),
            poll_interval_seconds=read(
                "ROTA_POLL_INTERVAL_SECONDS",
                _whole_seconds,
                "a whole number of seconds from 1 to 86400",
                default.poll_interval_seconds,
            ),
            metrics_port=read(
                "ROTA_METRICS_PORT",
                _port,
                "a port from 0 to 65535, or -1 for no server",
                default.metrics_port,
            ),
            metrics_host=env.get("ROTA_METRICS_HOST", default.metrics_host),
            peering_name=peering,
            standalone=read("ROTA_STANDALONE", _flag, "true or false", default.standalone),
            peering_priority=read(
                "ROTA_PEERING_PRIORITY",
                limits.whole_text,
                "a whole number",
                default.peering_priority,
            ),
            retry_max_seconds=read(
                "ROTA_RETRY_MAX_SECONDS", _seconds, _SECONDS, default.retry_max_seconds
            ),
            peering_wait_log_seconds=read(
                "ROTA_PEERING_WAIT_LOG_SECONDS",
                _seconds,
                _SECONDS,
                default.peering_wait_log_seconds,
            ),
        )

    @property
    def domain(self) -> str:
        """The prefix of this installation's finalizer and annotations."""
        return f"{self.instance}.rota.dev" if self.instance else "rota.dev"

    @property
    def finalizer(self) -> str:
        return f"{self.domain}/finalizer"

    def retry_delay(self, retry: int) -> float:
        """Exponential backoff for a database outage: 1, 2, 4 ... seconds, capped."""
        return float(min(self.retry_max_seconds, 2 ** min(retry, 16)))


def _names(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


_SECONDS = "a number of seconds more than 0 and at most 86400"


def _seconds(text: str) -> float | None:
    seconds = limits.number_text(text)
    return seconds if 0 < seconds <= 86400 and math.isfinite(seconds) else None


def _whole_seconds(text: str) -> int | None:
    seconds = limits.whole_text(text)
    return seconds if 1 <= seconds <= 86400 else None


def _port(text: str) -> int | None:
    port = limits.whole_text(text)
    return port if -1 <= port <= 65535 else None


def _flag(value: str) -> bool | None:
    word = value.strip().lower()
    return True if word in {"1", "true", "yes", "on"} else False if word in _OFF else None


_OFF = {"0", "false", "no", "off"}
