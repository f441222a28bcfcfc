"""The handler registry: which function runs which job type.

``@rota.handler("email.send")`` registers a sync or async function taking the
job, and optionally a `Context` as second argument (for handlers that need the
worker's database, like the built-in archive job or a handler that completes
its job in its own transaction).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from rota.db import Conn, connect
from rota.errors import InvalidInput

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


_registry: dict[str, Handler] = {}


def handler(job_type: str) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated function as the handler of `job_type`."""
    if not job_type or not job_type.strip():
        raise InvalidInput("a job type must not be empty")

    def register(func: HandlerFunc) -> HandlerFunc:
        params = [
            p
            for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        _registry[job_type] = Handler(
            type=job_type,
            func=func,
            is_async=inspect.iscoroutinefunction(func),
            wants_context=len(params) >= 2,
        )
        return func

    return register


def registered() -> dict[str, Handler]:
    """Every handler registered so far, by job type."""
    return dict(_registry)
