"""The handler registry: which function runs which job type.

``@rota.handler("email.send")`` registers a sync or async function taking the
job, and optionally a `Context` as second argument (for handlers that need the
worker's database, like the built-in archive job or a handler that completes
its job in its own transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rota import limits
from rota.db import Conn, connect
from rota.durable import Run, RunConnections
from rota.errors import InvalidInput
from rota.jobs import Job

log = logging.getLogger(__name__)

HandlerFunc = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Context:
    """What a running handler may know about the worker that runs it, and its
    durable calls (docs/durable-jobs.md): `step`, `sleep`, `wait_for`, `spawn`,
    `gather`. In an async handler each durable call is awaited."""

    dsn: str
    """The worker's database URL."""
    worker_id: str
    """host:pid:random, as written to locked_by."""
    job: Job | None = None
    """The job this context runs (None in the worker's own, shared context)."""
    is_async: bool = False
    """The handler is async: the durable calls return awaitables."""
    run: Run | None = dataclasses.field(default=None, compare=False, repr=False)
    connections: RunConnections | None = dataclasses.field(default=None, compare=False, repr=False)
    """Where each attempt's run borrows its connection (None: each opens its own)."""

    def connect(self) -> Conn:
        """A new connection to the worker's database (autocommit, rows as dicts)."""
        return connect(self.dsn)

    def for_job(self, job: Job, is_async: bool = False) -> Context:
        """The context of one attempt of `job` (the worker makes one per attempt)."""
        run = Run(self.dsn, self.worker_id, job, self.connections)
        return dataclasses.replace(self, job=job, is_async=is_async, run=run)

    def close(self) -> None:
        if self.run is not None:
            self.run.close()

    @property
    def conn(self) -> Conn:
        """The run's connection: inside a step, what is written through it commits
        with the step's result, exactly once."""
        return self._run().conn

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` once per job and `name`; a later run gets its stored result."""
        run = self._run()
        return (run.astep if self.is_async else run.step)(name, fn, *args, **kwargs)

    def sleep(self, seconds: float) -> Any:
        """Leave the worker (status waiting, slot freed) for `seconds`."""
        return self._call("sleep", seconds)

    def wait_for(self, key: str, timeout: float | None = None) -> Any:
        """The payload of the first `rota.emit` of `key`; `rota.TimedOut` past `timeout`."""
        return self._call("wait_for", key, timeout)

    def spawn(
        self, job_type: str, payload: Any = None, *, name: str | None = None, **options: Any
    ) -> Any:
        """Enqueue a child once per this job and `name`; its id."""
        if options.get("priority") is None:  # as rota.enqueue in this process
            options["priority"] = default_priority(job_type)
        return self._call("spawn", job_type, payload, name=name, **options)

    def gather(self, ids: Sequence[int]) -> Any:
        """The children's results in order once all are done; `rota.ChildFailed` if one died."""
        return self._call("gather", ids)  # the run checks them (never a string or a dict)

    def _run(self) -> Run:
        if self.run is None:
            raise InvalidInput("durable calls are made from a handler's own context")
        return self.run

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        run = self._run()
        if not self.is_async:
            return getattr(run, method)(*args, **kwargs)
        # Numbered now, in the order the handler calls; done in a thread when awaited.
        try:
            call = run.prepare(method, *args, **kwargs)
        except Exception as exc:  # raised where the handler awaits the call
            return _raising(exc)
        return asyncio.to_thread(call)


async def _raising(exc: Exception) -> Any:
    raise exc


def call(handler: Handler, job: Job, context: Context) -> Any:
    """Run a sync handler on `job` with a context of its own; return what it returned."""
    if not handler.wants_context:
        return handler.func(job)
    own = context.for_job(job)
    with _suspension_kept(own):
        return handler.func(job, own)


async def acall(handler: Handler, job: Job, context: Context) -> Any:
    """Run an async handler on `job` with a context of its own."""
    if not handler.wants_context:
        return await handler.func(job)
    own = context.for_job(job, is_async=True)
    with _suspension_kept(own):
        return await handler.func(job, own)


@contextlib.contextmanager
def _suspension_kept(own: Context) -> Iterator[None]:
    """Around a handler's call with its context `own` (closed after): once its
    run has suspended, the attempt ends `Suspended` whatever the handler did
    after it (caught it and returned, or raised something else). The job is
    waiting; what the handler made of it has nowhere to go."""
    assert own.run is not None
    try:
        yield
    except Exception:
        own.run.raise_if_suspended()
        raise
    finally:
        own.close()
    own.run.raise_if_suspended()


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


def default_priority(job_type: object) -> int:
    """The priority of a new job of `job_type` that names none: its handler's
    (registered in this process), else 0."""
    found = _registry.get(job_type) if isinstance(job_type, str) else None
    return found.priority if found is not None and found.priority is not None else 0


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
