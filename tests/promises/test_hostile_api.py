"""Hostile values at the doors the other promises leave open.

Each value here once escaped the rule of docs/limits.md: instead of
`InvalidInput` with a one-line reason and nothing written, the caller got
Python's own error (OverflowError, AttributeError, TypeError), a psycopg
error wrapped as a refused statement, a value changed on its way in, or a
row that a reader could not take. Each test gives the value and checks the
rule: InvalidInput, one line, and not one row written anywhere.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import rota
from rota import control, schedule_store, status, tracing
from rota.jobs import Job, NewJob, Status
from rota.settings import QueueSettings

HUGE = 10**400
"""A whole number no float holds: `float(HUGE)` raises OverflowError."""

NAIVE = datetime(2030, 1, 1)  # naive on purpose
T0 = datetime(2030, 1, 1, tzinfo=UTC)

Call = Callable[[psycopg.Connection[Any]], object]


def _written(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM rota.job), (SELECT count(*) FROM rota.job_limit),"
        " (SELECT count(*) FROM rota.paused_type), (SELECT count(*) FROM rota.job_effect),"
        " (SELECT count(*) FROM rota.job_event),"
        " (SELECT count(*) FROM rota.job WHERE status = 'cancelled')"
    ).fetchone()
    assert row is not None
    return tuple(row.values())


def _refused(conn: psycopg.Connection[Any], call: Call) -> str:
    before = _written(conn)
    with pytest.raises(rota.InvalidInput) as raised:
        call(conn)
    reason = str(raised.value)
    assert reason and "\n" not in reason, reason
    assert _written(conn) == before
    return reason


def _many_async(jobs: list[Any], **options: Any) -> Call:
    async def run(url: str) -> object:
        return await rota.enqueue_many_async(url, jobs, **options)

    return lambda c: asyncio.run(run(c.info.dsn))


# -- spans of seconds given as whole numbers too large for a float ---------------

SECONDS: dict[str, Call] = {
    "enqueue delay": lambda c: rota.enqueue(c, "t", delay=HUGE),
    "enqueue timeout": lambda c: rota.enqueue(c, "t", timeout=HUGE),
    "enqueue unique_for": lambda c: rota.enqueue(c, "t", key="k", unique_for=HUGE),
    "enqueue negative": lambda c: rota.enqueue(c, "t", delay=-HUGE),
    "enqueue_many, the second job": lambda c: rota.enqueue_many(
        c, [NewJob("ok"), NewJob("t", delay=HUGE)]
    ),
    "enqueue_many_async": _many_async([NewJob("ok"), NewJob("t", timeout=HUGE)]),
    "set_limit per": lambda c: rota.set_limit(c, "t", rate=5, per=HUGE),
}


@pytest.mark.parametrize("entry", sorted(SECONDS))
def test_seconds_too_large_for_a_float_are_refused(
    conn: psycopg.Connection[Any], entry: str
) -> None:
    # float(10**400) raises OverflowError; so did the check that meant to refuse it.
    assert " must " in _refused(conn, SECONDS[entry])


# -- enqueue_many's items --------------------------------------------------------

NOT_JOBS: dict[str, list[Any]] = {
    "a string after a job": [NewJob("ok"), "t"],
    "a tuple": [("t", {})],
    "a dict": [{"type": "t"}],
    "None": [NewJob("ok"), None],
}


@pytest.mark.parametrize("kind", sorted(NOT_JOBS))
def test_enqueue_many_refuses_items_that_are_not_jobs(
    conn: psycopg.Connection[Any], kind: str
) -> None:
    # Each item was read as a NewJob (its unique_for) before any was checked.
    jobs = NOT_JOBS[kind]
    assert "NewJob" in _refused(conn, lambda c: rota.enqueue_many(c, jobs))
    assert "NewJob" in _refused(conn, _many_async(jobs))


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"settings": None}, "settings must be a QueueSettings"),
        ({"settings": {"max_payload_bytes": 10}}, "settings must be a QueueSettings"),
    ],
)
def test_enqueue_refuses_settings_of_another_kind(
    conn: psycopg.Connection[Any], options: dict[str, Any], reason: str
) -> None:
    assert _refused(conn, lambda c: rota.enqueue(c, "t", **options)).startswith(reason)


@pytest.mark.parametrize("flag", [None, 0, 1, "yes"])
def test_unique_active_is_true_or_false(conn: psycopg.Connection[Any], flag: Any) -> None:
    # None and 0 passed as "no" without a word; 1 and "yes" were refused.
    reason = _refused(conn, lambda c: rota.enqueue(c, "t", key="k", unique_active=flag))
    assert reason.startswith("unique_active must be True or False")


# -- the clock a caller injects ----------------------------------------------------

CLOCKS: dict[str, Any] = {
    "text": "yesterday", "a number": 5, "naive": NAIVE, "a date": T0.date(),
    "year 1": datetime(1, 1, 1, tzinfo=UTC), "year 9999's end": datetime(9999, 12, 31, tzinfo=UTC),
}  # fmt: skip
AT_NOW: dict[str, Callable[[Any], Call]] = {
    "enqueue": lambda now: lambda c: rota.enqueue(c, "t", now=now),
    "enqueue_many": lambda now: lambda c: rota.enqueue_many(c, [NewJob("t")], now=now),
    "enqueue_many_async": lambda now: _many_async([NewJob("t")], now=now),
    "set_limit": lambda now: lambda c: rota.set_limit(c, "t", concurrency=1, now=now),
    "list_limits": lambda now: lambda c: rota.list_limits(c, now=now),
    "pause": lambda now: lambda c: rota.pause(c, ["t"], now=now),
    "cancel": lambda now: lambda c: rota.cancel(c, [1], now),
    "retry": lambda now: lambda c: control.retry(c, [1], now=now),
    "schedule upsert": lambda now: (
        lambda c: schedule_store.upsert(
            c, schedule_store.ScheduleSpec("s", "t", "0 0 * * *"), now=now
        )
    ),
    "schedule set_suspended": lambda now: (
        lambda c: schedule_store.set_suspended(c, "s", True, now=now)
    ),
    "read_status": lambda now: lambda c: status.read_status(c, now=now),
}


@pytest.mark.parametrize("clock", sorted(CLOCKS))
@pytest.mark.parametrize("entry", sorted(AT_NOW))
def test_an_injected_clock_must_be_an_aware_datetime(
    conn: psycopg.Connection[Any], entry: str, clock: str
) -> None:
    # Text was parsed by PostgreSQL ('yesterday' enqueued a job a day back, 'x'
    # raised a wrapped InvalidDatetimeFormat), a number failed its cast, and a
    # naive datetime was read in the session's time zone.
    rota.enqueue(conn, "t")  # job 1, for cancel and retry
    reason = _refused(conn, AT_NOW[entry](CLOCKS[clock]))
    assert reason.startswith("now must be"), reason


def test_an_aware_injected_clock_still_works(conn: psycopg.Connection[Any]) -> None:
    job_id = rota.enqueue(conn, "t", delay=5, now=T0)
    row = conn.execute("SELECT run_at FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert row == {"run_at": datetime(2030, 1, 1, 0, 0, 5, tzinfo=UTC)}


# -- job control -------------------------------------------------------------------


@pytest.mark.parametrize("statuses", [5, None, Status.DEAD, "dead"])
def test_retry_takes_a_list_of_statuses(conn: psycopg.Connection[Any], statuses: Any) -> None:
    # A number raised TypeError; a bare status was read as its letters.
    reason = _refused(conn, lambda c: control.retry(c, [1], statuses=statuses))
    assert reason.startswith("statuses must be a list"), reason


def test_pause_and_resume_take_the_type_as_given(conn: psycopg.Connection[Any]) -> None:
    # rota.enqueue and rota.set_limit keep a job type as given, white space and
    # all, and so does a plain INSERT into rota.paused_type; rota.pause stripped
    # it, so that the pause of ' x ' paused 'x' and left the jobs of ' x ' running.
    rota.enqueue(conn, " x ")
    assert rota.pause(conn, [" x "]) == [" x "]
    assert rota.paused(conn) == [" x "]
    assert rota.resume(conn, [" x "]) == [" x "]
    assert rota.paused(conn) == []


# -- results and effects ---------------------------------------------------------


class _Opaque:
    pass


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


RUNNING = Job(1, "t", {}, "k", Status.RUNNING, T0, 1, 3, locked_by="w")
EFFECT_RESULTS: dict[str, Any] = {
    "NaN": {"x": math.nan},
    "infinity": math.inf,
    "a NUL": "a\x00b",
    "a lone surrogate": ["\ud800"],
    "a Decimal": Decimal("1.5"),
    "an object": _Opaque(),
    "too deep": _nested(101),
    "too large": "x" * 300_000,
}


@pytest.mark.parametrize("kind", sorted(EFFECT_RESULTS))
def test_an_effect_s_result_keeps_the_rules_of_a_result(
    conn: psycopg.Connection[Any], kind: str
) -> None:
    # NaN, infinity, a NUL or a lone surrogate reached PostgreSQL and came back
    # as a refused statement; a Decimal or an object raised TypeError; a result
    # deeper or larger than any payload or handler result was stored.
    value = EFFECT_RESULTS[kind]
    reason = _refused(conn, lambda c: rota.record_effect(c, RUNNING, "charge", value))
    assert "effect's result" in reason or "a string in" in reason, reason


@pytest.mark.parametrize("effect", [5, "a\x00b", "", "x" * 1025, None])
def test_an_effect_s_name_is_checked_when_it_is_read_too(
    conn: psycopg.Connection[Any], effect: Any
) -> None:
    reason = _refused(conn, lambda c: rota.effect_result(c, RUNNING, effect))
    assert reason.startswith("effect "), reason


@pytest.mark.parametrize(
    "call",
    [
        lambda c: rota.record_effect(c, None, "charge"),  # type: ignore[arg-type]
        lambda c: rota.effect_result(c, {"id": 1}, "charge"),  # type: ignore[arg-type]
        lambda c: rota.complete(c, None),  # type: ignore[arg-type]
        lambda c: rota.complete(c, 1),  # type: ignore[arg-type]
    ],
)
def test_effects_and_complete_take_a_job(conn: psycopg.Connection[Any], call: Call) -> None:
    assert "a Job" in _refused(conn, call)


# -- OpenTelemetry: a trace context of any shape, a batch checked first ------------


@pytest.fixture
def traced() -> Iterator[None]:
    """A tracer provider for the test's duration (spans go nowhere), none after it."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace

    def set_provider(provider: Any) -> None:
        trace._TRACER_PROVIDER_SET_ONCE = trace.Once()  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        if provider is not None:
            trace.set_tracer_provider(provider)

    provider = sdk.TracerProvider()
    set_provider(provider)
    try:
        yield
    finally:
        set_provider(None)
        provider.shutdown()


@pytest.mark.parametrize(
    "stored",
    ["'[1, 2]'", "'\"x\"'", "'5'", "'{\"traceparent\": 5}'", '\'{"traceparent": ["x"]}\''],
)
def test_a_stored_trace_context_of_any_shape_does_not_stop_an_attempt(
    conn: psycopg.Connection[Any], traced: None, stored: str
) -> None:
    # Any writer of rota.job may fill trace_context; a list, a string or a
    # number made the attempt's consumer span raise before its handler ran.
    job_id = conn.execute(
        f"INSERT INTO rota.job (type, trace_context) VALUES ('t', {stored}) RETURNING id"  # type: ignore[arg-type]
    ).fetchone()["id"]
    job = rota.lookup.get_job(conn, job_id)
    with tracing.consumer(job) as span:
        assert span is not None


@pytest.mark.parametrize(
    "jobs",
    [[NewJob("ok"), NewJob(None)], [NewJob([])], [NewJob("ok"), "t"]],  # type: ignore[arg-type]
)
def test_a_traced_batch_is_checked_before_its_span(
    conn: psycopg.Connection[Any], traced: None, jobs: list[Any]
) -> None:
    # The producer span sorted the batch's types (None beside a string, a list)
    # before any job was checked: TypeError.
    _refused(conn, lambda c: rota.enqueue_many(c, jobs))


# -- connections an ORM hands over ---------------------------------------------------


def sqlalchemy_url(db_url: str) -> Any:
    """The SQLAlchemy URL (psycopg 3 driver) of a libpq connection string."""
    from sqlalchemy import URL

    info = conninfo_to_dict(db_url)
    return URL.create(
        "postgresql+psycopg",
        username=info.get("user"),
        host=info.get("host"),
        port=int(info["port"]) if info.get("port") else None,
        database=info.get("dbname"),
    )


def test_sqlalchemy_objects_that_are_no_connection_are_refused(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session, sessionmaker

    engine = sa.create_engine(sqlalchemy_url(db_url))
    try:
        closed = engine.connect()
        closed.close()
        for given in (engine, sessionmaker(engine), closed, Session()):
            reason = _refused(conn, lambda c, given=given: rota.enqueue(given, "t"))
            assert "SQLAlchemy" in reason, reason
    finally:
        engine.dispose()


def test_an_async_engine_is_refused_for_what_it_is(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(sqlalchemy_url(db_url))

    async def enqueue() -> object:
        return await rota.enqueue_async(engine, "t")  # type: ignore[arg-type]

    reason = _refused(conn, lambda c: asyncio.run(enqueue()))
    # It is asynchronous: the reason said "AsyncEngine is synchronous".
    assert "synchronous" not in reason and "AsyncEngine" in reason, reason


def test_a_refused_job_leaves_the_caller_s_session_alone(db_url: str) -> None:
    # The session's transaction was begun for the batch before its jobs were
    # checked: a refused batch left the caller's session in a transaction.
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sa.create_engine(sqlalchemy_url(db_url))
    try:
        with Session(engine) as session:
            with pytest.raises(rota.InvalidInput):
                rota.enqueue(session, "t", {"x": math.nan})
            assert not session.in_transaction()
    finally:
        engine.dispose()


def test_the_settings_of_a_queue_are_still_taken(conn: psycopg.Connection[Any]) -> None:
    small = QueueSettings(max_payload_bytes=10)
    with pytest.raises(rota.InvalidInput, match="over the limit of 10 bytes"):
        rota.enqueue(conn, "t", {"x": "y" * 20}, settings=small)
    assert isinstance(rota.enqueue(conn, "t", {}, settings=small), int)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        (lambda: QueueSettings(default_max_attempts=True), "default_max_attempts must be"),
        (lambda: QueueSettings(default_max_attempts=1.5), "default_max_attempts must be"),
        (lambda: QueueSettings(default_max_attempts="5"), "default_max_attempts must be"),
        (lambda: QueueSettings(default_max_attempts=2**31), "default_max_attempts must be"),
        (lambda: QueueSettings(max_payload_bytes=math.nan), "max_payload_bytes must be"),
        (lambda: QueueSettings(max_payload_bytes=10.5), "max_payload_bytes must be"),
        (lambda: QueueSettings(max_payload_bytes=None), "max_payload_bytes must be"),
        (lambda: QueueSettings(max_payload_bytes=300_000), "max_payload_bytes must be at most"),
    ],
)
def test_a_queue_s_settings_are_whole_numbers_within_the_database_s_limits(
    settings: Callable[[], Any], reason: str
) -> None:
    with pytest.raises(rota.InvalidInput, match=reason):
        settings()


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (lambda c: schedule_store.upsert(c, {"name": "x"}), "must be a ScheduleSpec"),
        (lambda c: schedule_store.get(c, 5), "schedule name must be"),
        (lambda c: schedule_store.get(c, "a\x00"), "NUL"),
        (lambda c: schedule_store.get(c, "\udcff"), "UTF-8"),
    ],
)
def test_the_schedule_store_refuses_what_is_no_schedule(
    conn: psycopg.Connection[Any], call: Call, reason: str
) -> None:
    assert reason in _refused(conn, call)


# -- a durable job's calls ---------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (lambda run: run.gather(5), "child ids must be a list"),
        (lambda run: run.gather(None), "child ids must be a list"),
        (lambda run: run.gather("12"), "child ids must be a list"),
        (lambda run: run.sleep(HUGE), "sleep must be at most"),
        (lambda run: run.wait_for("k", timeout=HUGE), "wait timeout must be at most"),
        (lambda run: run.spawn("t", delay=HUGE), "delay must be at most"),
    ],
)
def test_a_durable_job_s_calls_refuse_hostile_values(
    conn: psycopg.Connection[Any], db_url: str, call: Callable[[Any], object], reason: str
) -> None:
    # gather(5) raised TypeError; spans too large for a float, OverflowError.
    from rota.claim import claim
    from rota.durable import Run

    rota.enqueue(conn, "parent")
    [job] = claim(conn, "w", 1, 30)
    run = Run(db_url, "w", job)
    try:
        refused = _refused(conn, lambda c: call(run))
    finally:
        run.close()
    assert refused.startswith(reason), refused
    assert conn.execute("SELECT count(*) AS n FROM rota.job_wait").fetchone() == {"n": 0}


# -- the SQL door agrees -------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO rota.job_limit (type, concurrency) VALUES ('*', 1)",
        "UPDATE rota.job_limit SET type = '*'",
    ],
)
def test_a_limit_of_the_type_star_is_refused_by_sql_as_by_python(
    conn: psycopg.Connection[Any], statement: str
) -> None:
    # rota.set_limit refuses '*' (the name of the pause of every type), which a
    # plain INSERT or UPDATE stored: rota.clear_limit could then not remove it.
    rota.set_limit(conn, "t", concurrency=2)
    reason = _refused(conn, lambda c: rota.set_limit(c, "*", concurrency=1))
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(statement)  # type: ignore[arg-type]
    assert caught.value.diag.message_primary == reason
    assert [limit.type for limit in rota.list_limits(conn)] == ["t"]


def test_a_limit_named_star_from_before_the_rule_can_be_cleared(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("ALTER TABLE rota.job_limit DISABLE TRIGGER job_limit_checked")
    conn.execute("INSERT INTO rota.job_limit (type, concurrency) VALUES ('*', 1)")
    conn.execute("ALTER TABLE rota.job_limit ENABLE TRIGGER job_limit_checked")
    assert rota.clear_limit(conn, "*") is True
    assert rota.list_limits(conn) == []


def test_python_never_refuses_a_payload_the_database_stores(
    conn: psycopg.Connection[Any],
) -> None:
    # Python measured JSON with every non-ASCII character escaped (six bytes for
    # a character UTF-8 holds in three), the database the text it prints: a
    # payload of 80,000 such characters was refused by Python alone.
    text = "字" * 80_000
    stored = conn.execute(
        "INSERT INTO rota.job (type, payload) VALUES ('t', jsonb_build_object('x', %s::text))"
        " RETURNING id",
        (text,),
    ).fetchone()
    assert stored is not None
    job_id = rota.enqueue(conn, "t", {"x": text})
    row = conn.execute("SELECT payload FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None and row["payload"] == {"x": text}


def test_an_archived_row_has_a_status_the_readers_know(conn: psycopg.Connection[Any]) -> None:
    # The archive had no rule on its status: a row of status 'bogus', which any
    # worker role may insert, failed `rota jobs show` and the console's job page.
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts,"
            " max_attempts, created_at) VALUES (1, 't', '{}', 'bogus', now(), 0, 1, now())"
        )


@pytest.mark.parametrize("ids", [5, None, "12", {7: "x"}])
def test_a_handler_s_gather_refuses_what_is_no_list_of_ids(
    conn: psycopg.Connection[Any], db_url: str, ids: Any
) -> None:
    # The handler's context made a list of them first: gather(5) raised
    # TypeError, "12" was read as ids 1 and 2, a dict as its keys.
    from rota.claim import claim
    from rota.handlers import Context

    rota.enqueue(conn, "parent")
    [job] = claim(conn, "w", 1, 30)
    ctx = Context(db_url, "w").for_job(job)
    try:
        refused = _refused(conn, lambda c: ctx.gather(ids))
    finally:
        ctx.close()
    assert refused.startswith("child ids must be a list"), refused


KEYED: dict[str, Call] = {
    "enqueue, a number": lambda c: rota.enqueue(c, "t", {1: "a"}),
    "enqueue, deep inside": lambda c: rota.enqueue(c, "t", {"a": [{"b": {None: 1}}]}),
    "enqueue, two keys of one text": lambda c: rota.enqueue(c, "t", {1: "a", "1": "b"}),
    "enqueue_many": lambda c: rota.enqueue_many(c, [NewJob("ok"), NewJob("t", {True: 1})]),
    "emit": lambda c: rota.emit(c, "e", {1.5: "x"}),
    "schedule": lambda c: schedule_store.upsert(
        c, schedule_store.ScheduleSpec("s", "t", "* * * * *", payload={2: "x"})
    ),
}


@pytest.mark.parametrize("call", KEYED.values(), ids=list(KEYED))
def test_a_payload_key_that_is_not_text_is_refused(
    conn: psycopg.Connection[Any], call: Call
) -> None:
    # JSON keys are text: {1: "a"} was stored as {"1": "a"}, and {1: "a", "1": "b"}
    # kept one of its two values.
    reason = _refused(conn, call)
    assert "key" in reason and "text" in reason, reason
    assert conn.execute("SELECT count(*) AS n FROM rota.schedule WHERE name = 's'").fetchone() == {
        "n": 0
    }


def test_what_a_handler_returns_keeps_json_s_text_keys() -> None:
    # Refused after the handler ran, the job would run again: a result's keys
    # are made text, as JSON makes them.
    from rota import limits

    assert limits.encode_result({1: "a"}) == '{"1":"a"}'
