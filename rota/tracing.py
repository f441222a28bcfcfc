"""OpenTelemetry traces, when the extra ``rota[otel]`` is installed.

A producer span wraps each enqueue and the W3C trace context of that span
(``traceparent``, ``tracestate``) is stored with the job; each attempt of the
job runs in a consumer span whose parent is that context, so one trace goes
from, say, a web request's enqueue to the handler's own spans. Spans follow
OpenTelemetry's messaging conventions (``messaging.system`` is ``rota``, the
destination is the job type) with the attempt and its outcome as attributes,
and an error of the attempt recorded on its span.

Without opentelemetry-api nothing is imported past the first look for it and
nothing is stored: `enabled()` is False for good. With it, spans go wherever
the application's tracer provider sends them; until the application sets one,
Rota makes no span and stores no trace context.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rota.jobs import Job, NewJob, Outcome

SYSTEM = "rota"
_api: Any = None
"""(trace, propagate) from opentelemetry once looked for; False when it is not installed."""


def enabled() -> bool:
    """True when opentelemetry-api can be imported (looked for once)."""
    global _api
    if _api is None:
        try:
            trace = importlib.import_module("opentelemetry.trace")
            propagate = importlib.import_module("opentelemetry.propagate")
        except ImportError:
            _api = False
        else:
            _api = (trace, propagate)
    return _api is not False


def _on() -> bool:
    """True when spans would go somewhere: OpenTelemetry is installed and the
    application has set a tracer provider (until then Rota makes no span and
    stores no context, at the cost of this look)."""
    if _api is None:
        enabled()  # looked for once
    if _api is False:
        return False
    trace = _api[0]
    # No provider set, and none named by the environment (OTEL_PYTHON_TRACER_PROVIDER,
    # read when a provider is first asked for): the common case, asked for every
    # attempt, decided without get_tracer_provider()'s look at os.environ. Where
    # the attribute is gone in a later opentelemetry-api, the full look decides.
    if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_NAMED:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


_UNKNOWN = object()
_PROVIDER_NAMED = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


class Sent:
    """The producer span of one enqueue, and the trace context its jobs carry."""

    def __init__(self, span: Any, context: str | None) -> None:
        self.span = span
        self.context = context
        """The W3C trace context as JSON text, for the job's trace_context column."""

    def sent(self, ids: Sequence[int]) -> None:
        if len(ids) == 1:
            self.span.set_attribute("messaging.message.id", str(ids[0]))


_NOT_TRACED: contextlib.nullcontext[None] = contextlib.nullcontext()


def producer(jobs: Sequence[NewJob]) -> contextlib.AbstractContextManager[Sent | None]:
    """The producer span of an enqueue of `jobs`; None (and no cost) without OpenTelemetry
    or a tracer provider."""
    if not _on():
        return _NOT_TRACED
    return _producer(jobs)


@contextlib.contextmanager
def _producer(jobs: Sequence[NewJob]) -> Iterator[Sent | None]:
    trace, propagate = _api
    # Before the jobs are checked (inside the span): a type may be anything.
    types = {job.type if isinstance(job.type, str) else None for job in jobs}
    destination = types.pop() if len(types) == 1 else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if destination is not None:
        attributes["messaging.destination.name"] = destination
    if len(jobs) > 1:
        attributes["messaging.batch.message_count"] = len(jobs)
    name = f"send {destination}" if destination is not None else "send"
    tracer = trace.get_tracer("rota")
    with tracer.start_as_current_span(
        name, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Sent(span, json.dumps(carrier) if carrier else None)


def consumer(job: Job) -> contextlib.AbstractContextManager[Any]:
    """The consumer span of one attempt of `job`, current while its handler runs;
    a child of the span that enqueued it (call `ended` with the attempt's outcome).
    None (and no cost) without OpenTelemetry or a tracer provider."""
    if _api is False or not _on():  # called for every attempt: the first test is the cheap one
        return _NOT_TRACED
    return _consumer(job)


@contextlib.contextmanager
def _consumer(job: Job) -> Iterator[Any]:
    trace, propagate = _api
    context = propagate.extract(_carrier(job.trace_context)) if job.trace_context else None
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.type,
        "messaging.message.id": str(job.id),
        "rota.job.attempt": job.attempts,
    }
    tracer = trace.get_tracer("rota")
    with tracer.start_as_current_span(
        f"process {job.type}",
        context=context,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
    ) as span:
        yield span


def _carrier(stored: Any) -> dict[str, str]:
    """The text fields of a stored trace context: any writer of rota.job may put
    any JSON there, and the propagator reads only an object of strings."""
    if not isinstance(stored, dict):
        return {}
    return {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, str)}


def ended(span: Any, outcome: Outcome, error: str | None) -> None:
    """Put an attempt's outcome on its consumer span, and its error if it had one."""
    trace, _ = _api
    span.set_attribute("rota.job.outcome", outcome.value)
    if error:
        head = error.splitlines()[0]
        kind, _, message = head.partition(": ")
        span.add_event(
            "exception",
            {
                "exception.type": kind,
                "exception.message": message,
                "exception.stacktrace": error,
            },
        )
        span.set_status(trace.Status(trace.StatusCode.ERROR, head))
