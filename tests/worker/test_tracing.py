"""OpenTelemetry: one trace from a web request's enqueue to the handler's own
span, through the W3C trace context stored with the job; and nothing imported
or stored without OpenTelemetry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

import rota
from rota.handlers import Handler
from rota.jobs import Job
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _running

pytest.importorskip("opentelemetry.sdk")
httpx = pytest.importorskip("httpx")
fastapi = pytest.importorskip("fastapi")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402


def _set_global_provider(provider: TracerProvider | None) -> None:
    # OpenTelemetry sets its global provider once per process; its own tests reset
    # these two globals between tests the same way (opentelemetry.test.globals_test).
    trace._TRACER_PROVIDER_SET_ONCE = trace.Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished during the test; no tracer provider before or after it (the
    other tests' jobs carry no trace context)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _set_global_provider(provider)
    try:
        yield exporter
    finally:
        _set_global_provider(None)
        provider.shutdown()


def _welcome(job: Job) -> dict[str, Any]:
    with trace.get_tracer("app").start_as_current_span("render welcome email"):
        return {"sent": job.payload["email"]}


async def _flaky(job: Job) -> None:
    raise ValueError(f"mail server refused {job.payload['email']}")


HANDLERS = {
    "email.welcome": Handler("email.welcome", _welcome, is_async=False, wants_context=False),
    "email.flaky": Handler("email.flaky", _flaky, is_async=True, wants_context=False),
}


def web_app(db_url: str) -> Any:
    """A web service whose request enqueues a job (FastAPI makes the request's span)."""
    app = fastapi.FastAPI()

    @app.post("/signup/{job_type}")
    async def signup(job_type: str, email: str) -> dict[str, int]:
        return {"job": await rota.enqueue_async(db_url, job_type, {"email": email})}

    return app


async def post(db_url: str, job_type: str) -> int:
    transport = httpx.ASGITransport(app=web_app(db_url))
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        reply = await client.post(f"/signup/{job_type}", params={"email": "a@example.com"})
    assert reply.status_code == 200, reply.text
    return int(reply.json()["job"])


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in finished}


@pytest.mark.asyncio
async def test_one_trace_from_the_requests_enqueue_to_the_handlers_span(
    spans, conn, db_url
) -> None:
    job_id = await post(db_url, "email.welcome")
    stored = conn.execute("SELECT trace_context FROM rota.job WHERE id = %s", (job_id,))
    assert set(stored.fetchone()["trace_context"]) >= {"traceparent"}
    with _running(db_url, HANDLERS, concurrency=1):
        wait_for(
            lambda: "render welcome email" in by_name(spans.get_finished_spans()),
            what="the handler's span",
        )
    named = by_name(spans.get_finished_spans())
    request, sent = named["POST /signup/{job_type}"], named["send email.welcome"]
    process, handler = named["process email.welcome"], named["render welcome email"]
    assert request.kind is SpanKind.SERVER
    assert {s.context.trace_id for s in named.values()} == {request.context.trace_id}
    assert request.parent is None
    # The enqueue's span is inside the request's (under FastAPI's own spans of it).
    inside = {s.context.span_id for s in named.values() if s.start_time >= request.start_time}
    assert sent.parent.span_id in inside - {sent.context.span_id}
    assert request.start_time <= sent.start_time <= sent.end_time <= request.end_time
    assert process.parent.span_id == sent.context.span_id
    assert handler.parent.span_id == process.context.span_id
    assert (sent.kind, process.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert sent.attributes["messaging.message.id"] == str(job_id)
    assert dict(process.attributes) == {
        "messaging.system": "rota",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "email.welcome",
        "messaging.message.id": str(job_id),
        "rota.job.attempt": 1,
        "rota.job.outcome": "done",
    }
    assert process.status.status_code is StatusCode.UNSET


@pytest.mark.asyncio
async def test_a_failed_attempt_records_its_error_on_its_span(spans, conn, db_url) -> None:
    job_id = await post(db_url, "email.flaky")
    conn.execute("UPDATE rota.job SET max_attempts = 1 WHERE id = %s", (job_id,))
    with _running(db_url, HANDLERS, concurrency=1):
        wait_for(lambda: "process email.flaky" in by_name(spans.get_finished_spans()))
    process = by_name(spans.get_finished_spans())["process email.flaky"]
    assert process.attributes["rota.job.outcome"] == "retry"  # the database made it dead
    assert process.status.status_code is StatusCode.ERROR
    assert process.status.description == "ValueError: mail server refused a@example.com"
    [event] = process.events
    assert (event.name, event.attributes["exception.type"]) == ("exception", "ValueError")
    assert event.attributes["exception.stacktrace"].startswith("ValueError: mail server")


def test_a_batch_has_one_span_and_its_jobs_one_context(spans, conn) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("a"), rota.NewJob("b"), rota.NewJob("a")])
    [sent] = spans.get_finished_spans()
    assert (sent.name, sent.attributes["messaging.batch.message_count"]) == ("send", 3)
    contexts = conn.execute(
        "SELECT DISTINCT trace_context FROM rota.job WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert len(contexts) == 1 and contexts[0]["trace_context"]["traceparent"]


def test_without_opentelemetry_nothing_is_imported_or_stored(db_url: str) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        import psycopg, rota
        from rota import tracing
        job_id = rota.enqueue(sys.argv[1], "t")
        rota.enqueue_many(sys.argv[1], [rota.NewJob("t"), rota.NewJob("u")])
        assert not tracing.enabled()
        assert [m for m in sys.modules if m.startswith("opentelemetry.")] == []
        with psycopg.connect(sys.argv[1]) as conn:
            stored = conn.execute("SELECT count(trace_context) FROM rota.job").fetchone()
        assert stored == (0,), stored
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, db_url], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_without_a_tracer_provider_no_span_is_made_and_nothing_is_stored(conn) -> None:
    from rota import tracing

    assert tracing.enabled() and not isinstance(trace.get_tracer_provider(), TracerProvider)
    job = rota.NewJob("t")
    with tracing.producer([job]) as sent:
        assert sent is None
    job_id = rota.enqueue(conn, "t")
    stored = conn.execute("SELECT trace_context FROM rota.job WHERE id = %s", (job_id,))
    assert stored.fetchone()["trace_context"] is None
