"""The handler registry: which function runs which job type.

``@rota.handler("email.send")`` registers a sync or async function taking the
job, and optionally a `Context` as second argument (for handlers that need the
worker's database, like the built-in archive job or a handler that completes
its job in its own transaction).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from rota import limits
from rota.db import Conn, connect
from rota.errors import InvalidInput

log = logging.getLogger(__name__)

HandlerFunc = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Context:
    """What a running handler may know about the worker that runs it."""

    dsn: str
    """The worker's database URL."""
    worker_id: str
    """host:pid:random, as written to locked_by."""

    def connect(self) -> Conn:
        """A new connection to the worker's database (autocommit, rows as dicts)."""
        return connect(self.dsn)


@dataclasses.dataclass(frozen=True)
class Handler:
    type: str
    func: HandlerFunc
    is_async: bool
    wants_context: bool
    timeout: float | None = None
    """Seconds an attempt may run when the job does not say (None: the worker's default)."""
    priority: int | None = None
    """Priority of jobs of this type enqueued without one, by this process."""


_registry: dict[str, Handler] = {}
replaced: list[tuple[Handler, Handler]] = []
"""(old, new) for every handler a later registration of its type replaced: the
last one wins, and `rota worker` refuses to start with two (a type has one)."""


def handler(
    job_type: str, *, timeout: float | None = None, priority: int | None = None
) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated function as the handler of `job_type`.

    `timeout`: seconds an attempt may run unless its job says otherwise;
    `priority`: the default priority of jobs of this type (0 first, 9 last).
    """
    limits.name(job_type, "job type")
    if timeout is not None:
        limits.timeout_seconds(timeout)
    if priority is not None:
        limits.priority(priority)

    def register(func: HandlerFunc) -> HandlerFunc:
        params = [
            p
            for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        new = Handler(
            type=job_type,
            func=func,
            is_async=inspect.iscoroutinefunction(func),
            wants_context=len(params) >= 2,
            timeout=timeout,
            priority=priority,
        )
        old = _registry.get(job_type)
        if old is not None and old.func is not func:
            replaced.append((old, new))
            log.warning(
                "job type %r: handler %s replaced by %s (a type has one handler)",
                job_type, describe(old), describe(new),
            )  # fmt: skip
        _registry[job_type] = new
        return func

    return register


def describe(found: Handler) -> str:
    """A handler as `module.function`."""
    func = found.func
    name = getattr(func, "__qualname__", None) or repr(func)
    return f"{getattr(func, '__module__', '?')}.{name}"


def registered() -> dict[str, Handler]:
    """Every handler registered so far, by job type."""
    return dict(_registry)


def check_served(types: Sequence[str]) -> None:
    """Refuse job types that no registered handler serves: a worker told to claim
    them would fail every such job for good (a typo in --types or --handlers)."""
    missing = [t for t in limits.names(types, "job types") if t not in _registry]
    if missing:
        served = ", ".join(sorted(_registry)) or "none"
        raise InvalidInput(
            f"no loaded handler serves job type(s) {', '.join(map(repr, missing))}"
            f" (check --types and --handlers; handlers loaded: {served})"
        )
