"""The limits of docs/limits.md, kept by the database for every writer.

Migration 0024's triggers (asked first through a guard in their WHEN clause
since 0029) refuse a value outside the limits whichever way it is written:
rota.enqueue() in SQL, a plain INSERT, a plain UPDATE (a migration script, a
hand fix). The refusal is invalid_parameter_value (22023) with the
same one-line reason on every path; Python's own checks use the same numbers
(the edges below are accepted by both, one step past refused by both).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rota
from rota import limits
from rota.errors import InvalidInput

DEEP = "(repeat('[', 5000) || repeat(']', 5000))::jsonb"


def _nested(depth: int) -> str:
    return f"(repeat('[', {depth}) || repeat(']', {depth}))::jsonb"


JUST_TOO_DEEP = _nested(limits.MAX_JSON_DEPTH + 1)
BIG = f"jsonb_build_object('x', repeat('a', {limits.MAX_PAYLOAD_BYTES}))"

RESERVED = "an idempotency key must not start with 'schedule:'"
"""The prefix of the keys of a schedule's jobs, refused for every other job."""

# column, SQL value, the reason's start (the same on every path)
HOSTILE = [
    ("run_at", "'infinity'", "run_at must be from 1970-01-01 to 9999-12-30 UTC"),
    ("run_at", "'-infinity'", "run_at must be from 1970-01-01 to 9999-12-30 UTC"),
    ("run_at", "'20000-01-01T00:00:00Z'", "run_at must be from 1970-01-01 to 9999-12-30 UTC"),
    ("run_at", "'9999-12-30T00:00:01Z'", "run_at must be from 1970-01-01 to 9999-12-30 UTC"),
    ("run_at", "'1969-12-31T23:59:59Z'", "run_at must be from 1970-01-01 to 9999-12-30 UTC"),
    ("payload", DEEP, "payload is nested more than 100 levels deep"),
    ("payload", JUST_TOO_DEEP, "payload is nested more than 100 levels deep"),
    ("payload", BIG, "payload is 262153 bytes, over the limit of 262144 bytes"),
    ("type", "''", "job type must be a non-empty string"),
    ("type", "E' \\t\\u3000'", "job type must be a non-empty string"),
    ("type", "repeat('x', 1025)", "job type is 1025 bytes long, over the limit of 1024"),
    ("type", "repeat('é', 513)", "job type is 1026 bytes long, over the limit of 1024"),
    ("idempotency_key", "''", "an idempotency key must be a non-empty string"),
    ("idempotency_key", "repeat('k', 2000)", "an idempotency key is 2000 bytes long"),
    ("idempotency_key", "'schedule:1:2030-01-01T00:00:00+00:00'", RESERVED),
    ("unique_key", "'schedule:1'", RESERVED),
    ("group_key", "' '", "a group must be a non-empty string"),
    ("priority", "10", "priority must be a whole number from 0 (first) to 9, not 10"),
    ("priority", "-1", "priority must be a whole number from 0 (first) to 9, not -1"),
    ("max_attempts", "0", "max_attempts must be a whole number of at least 1, not 0"),
    ("timeout_seconds", "'NaN'", "timeout must be more than 0 and at most 315360000 seconds"),
    ("timeout_seconds", "'Infinity'", "timeout must be more than 0 and at most 315360000"),
    ("timeout_seconds", "0", "timeout must be more than 0 and at most 315360000 seconds"),
]

_ENQUEUE_ARG = {
    "run_at": "run_at",
    "payload": "payload",
    "type": "job_type",
    "idempotency_key": "key",
    "group_key": "group_key",
    "priority": "priority",
    "max_attempts": "max_attempts",
}


def _refusal(conn: psycopg.Connection[Any], statement: str) -> str:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(statement)  # type: ignore[arg-type]
    message = caught.value.diag.message_primary
    assert message is not None
    return message


def _jobs(conn: psycopg.Connection[Any]) -> list[Any]:
    return conn.execute("SELECT id, type, payload::text FROM rota.job ORDER BY id").fetchall()


@pytest.mark.parametrize(("column", "value", "reason"), HOSTILE)
def test_insert_update_and_sql_enqueue_refuse_alike(
    conn: psycopg.Connection[Any], column: str, value: str, reason: str
) -> None:
    rota.enqueue(conn, "ordinary", {"n": 1})
    before = _jobs(conn)
    messages = []
    values = {"type": "'t'", column: value}
    columns = ", ".join(values)
    messages.append(
        _refusal(conn, f"INSERT INTO rota.job ({columns}) VALUES ({', '.join(values.values())})")
    )
    messages.append(_refusal(conn, f"UPDATE rota.job SET {column} = {value}"))
    if column in _ENQUEUE_ARG:
        arg = _ENQUEUE_ARG[column]
        first = "" if arg == "job_type" else "'t', "
        messages.append(_refusal(conn, f"SELECT rota.enqueue({first}{arg} => {value})"))
    assert messages[0].startswith(reason), messages[0]
    assert len(set(messages)) == 1, messages  # one rule, one message
    assert _jobs(conn) == before


def test_python_refuses_with_the_same_reason(conn: psycopg.Connection[Any]) -> None:
    sql_reason = _refusal(conn, "SELECT rota.enqueue(repeat('x', 1025))")
    with pytest.raises(InvalidInput) as caught:
        rota.enqueue(conn, "x" * 1025)
    assert str(caught.value) == sql_reason
    late = datetime(9999, 12, 31, tzinfo=UTC)
    with pytest.raises(InvalidInput, match=r"^run_at must be from 1970-01-01 to 9999-12-30 UTC"):
        rota.enqueue(conn, "t", run_at=late)
    deep: Any = []
    for _ in range(limits.MAX_JSON_DEPTH):
        deep = [deep]
    with pytest.raises(InvalidInput, match=r"^payload is nested more than 100 levels deep$"):
        rota.enqueue(conn, "t", deep)
    with pytest.raises(InvalidInput) as caught:
        rota.enqueue(conn, "t", key="schedule:1:2030-01-01T00:00:00+00:00")
    assert str(caught.value) == _refusal(conn, "SELECT rota.enqueue('t', key => 'schedule:1:x')")
    assert _jobs(conn) == []


def test_a_refusal_reaching_python_from_the_database_is_invalid_input(
    conn: psycopg.Connection[Any],
) -> None:
    # Whatever statement meets the database's check, the caller gets InvalidInput
    # with the database's reason (and, for loops that count refused statements,
    # it is a DatabaseError too), nothing written.
    with (
        pytest.raises(InvalidInput, match=r"^priority must be a whole number") as caught,
        rota.db.errors_wrapped(),
    ):
        conn.execute("SELECT rota.enqueue('t', priority => 12)")
    assert isinstance(caught.value, rota.DatabaseError)
    assert _jobs(conn) == []


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("run_at", "'1970-01-01T00:00:00Z'"),
        ("run_at", "'9999-12-30T00:00:00Z'"),
        ("type", f"repeat('x', {limits.MAX_NAME_BYTES})"),
        ("idempotency_key", f"repeat('é', {limits.MAX_NAME_BYTES // 2})"),
        ("payload", _nested(limits.MAX_JSON_DEPTH)),
        ("payload", f"jsonb_build_object('x', repeat('a', {limits.MAX_PAYLOAD_BYTES - 9}))"),
        ("priority", str(max(limits.PRIORITIES))),
        ("max_attempts", str(limits.INTEGER_MAX)),
        ("timeout_seconds", str(limits.MAX_SECONDS)),
    ],
)
def test_the_edges_of_python_s_limits_are_accepted(
    conn: psycopg.Connection[Any], column: str, value: str
) -> None:
    values = {"type": "'t'", column: value}
    statement = f"INSERT INTO rota.job ({', '.join(values)}) VALUES ({', '.join(values.values())})"
    conn.execute(statement)  # type: ignore[arg-type]
    assert len(_jobs(conn)) == 1


CHARS = [chr(c) for c in range(1, 0x3100) if not 0xD800 <= c <= 0xDFFF]
CHARS += [chr(c) for c in range(0xFEFF, 0xFF00)] + [chr(0x10FFFF)]
"""Every character up to U+30FF (the white space of Python's str.isspace() is among
them), the byte order mark's block and the last one."""


def test_blank_means_what_python_s_strip_means(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute("SELECT c, rota.blank(c) AS blank FROM unnest(%s::text[]) c", (CHARS,))
    wrong = [hex(ord(r["c"])) for r in rows if r["blank"] != (not r["c"].strip())]
    assert wrong == []
    assert sys.maxunicode == 0x10FFFF


def test_old_rows_stay_and_updates_that_leave_them_alone_pass(
    conn: psycopg.Connection[Any],
) -> None:
    # A row from before the checks (written with them off) is not touched by the
    # migration, and a claim-like update of other columns still passes: one old
    # row cannot fail a statement that moves the jobs beside it.
    conn.execute("ALTER TABLE rota.job DISABLE TRIGGER job_checked_insert")
    conn.execute(f"INSERT INTO rota.job (type, payload, run_at) VALUES ('t', {DEEP}, now())")
    conn.execute("ALTER TABLE rota.job ENABLE TRIGGER job_checked_insert")
    rota.enqueue(conn, "t", {"n": 1})
    updated = conn.execute(
        "UPDATE rota.job SET status = 'running', attempts = attempts + 1, locked_by = 'w'"
    ).rowcount
    assert updated == 2


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO rota.job_limit (type, concurrency) VALUES (repeat('x', 1100), 1)",
        "INSERT INTO rota.job_limit (type, concurrency) VALUES ('  ', 1)",
        "INSERT INTO rota.paused_type (type) VALUES (repeat('x', 1100))",
        "INSERT INTO rota.schedule (name, job_type, cron, next_run_at)"
        " VALUES ('s', repeat('x', 1100), '* * * * *', now())",
        "INSERT INTO rota.schedule (name, job_type, cron, next_run_at, payload)"
        f" VALUES ('s', 't', '* * * * *', now(), {DEEP})",
    ],
)
def test_limits_pauses_and_schedules_keep_the_same_rules(
    conn: psycopg.Connection[Any], statement: str
) -> None:
    _refusal(conn, statement)


@pytest.mark.parametrize("per", ["'Infinity'", "'NaN'", "1e300", "315360001"])
def test_a_rate_s_window_is_kept_within_ten_years_at_every_door(
    conn: psycopg.Connection[Any], per: str
) -> None:
    # A window the claim cannot subtract from a time (infinity, NaN, 1e300) made
    # every claim of every type fail with "interval out of range"; the Python
    # API refused these values, a plain INSERT or UPDATE took them.
    reason = "per must be more than 0 and at most 315360000 seconds"
    assert reason in _refusal(
        conn, f"INSERT INTO rota.job_limit (type, rate, per_seconds) VALUES ('t', 5, {per})"
    )
    rota.set_limit(conn, "t", rate=5, per=60)
    assert reason in _refusal(conn, f"UPDATE rota.job_limit SET per_seconds = {per}")
    assert conn.execute("SELECT per_seconds FROM rota.job_limit").fetchone() == {
        "per_seconds": 60.0
    }
    with pytest.raises(InvalidInput):
        rota.set_limit(conn, "t", rate=5, per=float(per.strip("'")))


@pytest.mark.parametrize(
    ("key", "payload", "reason"),
    [
        ("''", "NULL", "event key must be a non-empty string"),
        ("E' \\t'", "NULL", "event key must be a non-empty string"),
        ("repeat('k', 1025)", "NULL", "event key is 1025 bytes long, over the limit of 1024"),
        ("'k'", DEEP, "payload is nested more than 100 levels deep"),
        ("'k'", BIG, "payload is 262153 bytes, over the limit of 262144 bytes"),
    ],
)
def test_an_event_keeps_the_rules_of_a_key_and_a_payload_at_every_door(
    conn: psycopg.Connection[Any], key: str, payload: str, reason: str
) -> None:
    # rota.emit() in SQL and a plain INSERT refuse what Python's rota.emit refuses.
    assert reason in _refusal(conn, f"SELECT rota.emit({key}, {payload})")
    insert = "INSERT INTO rota.job_event (key, payload, emitted_at) VALUES ({}, {}, now())"
    assert reason in _refusal(conn, insert.format(key, payload))
    assert conn.execute("SELECT count(*) AS n FROM rota.job_event").fetchone() == {"n": 0}


def test_the_guards_in_when_clauses_call_only_built_in_functions(
    conn: psycopg.Connection[Any],
) -> None:
    # A trigger's WHEN clause is made ready again for every statement, and a
    # function written in SQL in it is inlined there by parsing its body: 0029's
    # guard (rota.job_fits and the four functions under it) cost each one-row
    # INSERT 0.12 ms and each outcome statement 0.14 ms of the server's time, a
    # third of a one-job enqueue. Written with built-in functions, well under half.
    called = conn.execute(
        """
        SELECT t.tgname, p.proname, l.lanname
        FROM pg_trigger AS t
        JOIN pg_class AS c ON c.oid = t.tgrelid
        CROSS JOIN LATERAL regexp_matches(t.tgqual::text, ':(?:op)?funcid (\\d+)', 'g') AS m
        JOIN pg_proc AS p ON p.oid = m[1]::oid
        JOIN pg_language AS l ON l.oid = p.prolang
        WHERE c.relnamespace = 'rota'::regnamespace
        """
    ).fetchall()
    assert [row for row in called if row["lanname"] != "internal"] == []
    assert {
        "tgname": "job_checked_insert",
        "proname": "jsonb_path_exists",
        "lanname": "internal",
    } in called


# Values at and past every edge of docs/limits.md, as SQL, for the agreement
# test below: each trigger's WHEN (its guard, made by migration 0031) must pass
# over exactly the rows rota.job_checked() accepts.
NAMES = [
    "NULL", "'t'", "''", "' '", "E'\\u3000'", "E'\\u00a0x'", "E'x\\u0085'", "E'\\u0085'",
    "E'\\x1f'", "E'\\u200b'", "repeat('x', 1024)", "repeat('x', 1025)",
    "repeat('é', 512)", "repeat('é', 513)", "E' \\tx'",
]  # fmt: skip
INSTANTS = [
    "now()", "'1970-01-01T00:00:00Z'", "'1969-12-31T23:59:59.999999Z'",
    "'9999-12-30T00:00:00Z'", "'9999-12-30T00:00:00.000001Z'", "'infinity'", "'-infinity'",
    "NULL",
]  # fmt: skip
KEYS = [
    *NAMES,
    "'schedule:'", "'schedule:1'", "'schedule:1:x'", "'schedule:12:x'", "'schedule:1:'",
    "'schedule:12'", "'schedule:1x'", "'Schedule:1:x'", "' schedule:1:x'", "'schedules:1'",
]  # fmt: skip
"""Names, and keys under the prefix of a schedule's jobs: each is the key of the
jobs of schedule 1 or 12, of another or of none (SCHEDULES)."""
SCHEDULES = ["NULL", "1", "12", "2"]
PAYLOADS = [
    "'{}'", "NULL", "'[1e131071, 1e131071]'", "'[1e131071]'",
    _nested(limits.MAX_JSON_DEPTH), _nested(limits.MAX_JSON_DEPTH + 1),
    "jsonb_build_object('x', repeat('a', 262135))", "jsonb_build_object('x', repeat('a', 262136))",
    "jsonb_build_object('x', repeat(E'\\u0001', 43689))", "'\"\"'",
]  # fmt: skip
EDGES = {
    "type": NAMES, "idempotency_key": KEYS, "unique_key": KEYS, "group_key": NAMES,
    "schedule_id": SCHEDULES, "run_at": INSTANTS,
    "priority": ["NULL", "-1", "0", "9", "10"],
    "max_attempts": ["NULL", "-3", "0", "1", "2147483647"],
    "timeout_seconds": [
        "NULL", "'NaN'", "0", "-1", "1e-9", "315360000", "315360000.000001", "'Infinity'",
        "'-Infinity'",
    ],
    "payload": PAYLOADS,
}  # fmt: skip
WITHIN = {
    "type": "'t'", "idempotency_key": "NULL", "unique_key": "NULL", "group_key": "NULL",
    "schedule_id": "NULL", "run_at": "now()", "priority": "0", "max_attempts": "1",
    "timeout_seconds": "NULL", "payload": "'{}'",
}  # fmt: skip
"""A row within every limit."""
ROW = st.one_of(
    # Any value in every column: mostly rows that break several rules at once.
    st.fixed_dictionaries({column: st.sampled_from(values) for column, values in EDGES.items()}),
    # A row within the limits with one or two values changed, so that each edge
    # is also met alone, where one rule decides the verdict.
    st.lists(
        st.sampled_from([(column, value) for column, values in EDGES.items() for value in values]),
        min_size=1,
        max_size=2,
    ).map(lambda changes: {**WITHIN, **dict(changes)}),
)
_TYPES = {
    "type": "text", "idempotency_key": "text", "unique_key": "text", "group_key": "text",
    "schedule_id": "bigint", "run_at": "timestamptz", "priority": "smallint",
    "max_attempts": "integer", "timeout_seconds": "double precision", "payload": "jsonb",
}  # fmt: skip


MODES = {"all": "INSERT", "fields": "UPDATE", "payload": "UPDATE"}
"""The modes of rota.job_checked(), each with the statement that fires it."""
GUARDS = {
    "all": ["job_checked_insert"],
    "fields": ["job_checked_fields", "job_checked_run_at"],
    "payload": ["job_checked_payload"],
}
"""rota.job's triggers of each mode, whose WHEN clauses are the guards."""


@pytest.fixture
def probes(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """`conn` with two tables of rota.job's columns per mode of the checks (no
    constraint of their own: CREATE TABLE AS copies none), one row each:
    `check_<mode>` has a trigger that always calls rota.job_checked() in that
    mode, `guard_<mode>` the trigger rota.job has, its WHEN clause as defined,
    calling instead a function that writes down the row's type in `fired` and
    skips the row."""
    conn.execute("CREATE TEMP TABLE fired (type text)")
    conn.execute(
        "CREATE FUNCTION pg_temp.guard_fired() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO pg_temp.fired VALUES (NEW.type); RETURN NULL; END $$"
    )
    for mode, event in MODES.items():
        for kind in ("check", "guard"):
            conn.execute(f"CREATE TEMP TABLE {kind}_{mode} AS SELECT * FROM rota.job WITH NO DATA")  # type: ignore[arg-type]
            conn.execute(f"INSERT INTO {kind}_{mode} (type, payload) VALUES ('t', '{{}}')")  # type: ignore[arg-type]
        conn.execute(
            f"CREATE TRIGGER checked BEFORE {event} ON check_{mode}"  # type: ignore[arg-type]
            f" FOR EACH ROW EXECUTE FUNCTION rota.job_checked('{mode}')"
        )
        made = conn.execute(
            "SELECT pg_get_triggerdef(oid) AS made FROM pg_trigger"
            " WHERE tgrelid = 'rota.job'::regclass AND tgname = ANY(%s)",
            (GUARDS[mode],),
        ).fetchall()
        assert len(made) == len(GUARDS[mode]), GUARDS[mode]
        for row in made:
            copied = (
                row["made"]
                .replace(" ON rota.job ", f" ON pg_temp.guard_{mode} ")
                .replace(
                    f"EXECUTE FUNCTION rota.job_checked('{mode}')",
                    "EXECUTE FUNCTION pg_temp.guard_fired()",
                )
            )
            assert copied.count("pg_temp.") == 2, row["made"]
            conn.execute(copied)  # type: ignore[arg-type]
    return conn


def _verdicts(conn: psycopg.Connection[Any], mode: str, statement: str) -> tuple[bool, bool]:
    """`statement` (its table written `<table>`) on the probes of `mode`: whether
    rota.job_checked() accepted it, and whether rota.job's guard passed over it."""
    try:
        conn.execute(statement.replace("<table>", f"check_{mode}"))  # type: ignore[arg-type]
    except psycopg.errors.InvalidParameterValue:
        accepted = False
    else:
        accepted = True
    conn.execute("DELETE FROM pg_temp.fired")
    conn.execute(statement.replace("<table>", f"guard_{mode}"))  # type: ignore[arg-type]
    fired = conn.execute("SELECT count(*) AS n FROM pg_temp.fired").fetchone() == {"n": 1}
    return accepted, not fired


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(row=ROW)
def test_the_triggers_guard_passes_over_exactly_the_rows_the_checks_accept(
    probes: psycopg.Connection[Any], row: dict[str, str]
) -> None:
    # In each mode (a whole row, an update of the fields, of the payload): the
    # verdict of rota.job_checked(), beside whether rota.job's trigger would
    # have called it (the guard fired) for the same statement.
    values = {column: f"({row[column]})::{kind}" for column, kind in _TYPES.items()}
    columns = {"fields": [c for c in values if c != "payload"], "payload": ["payload"]}
    verdicts = {}
    for mode, event in MODES.items():
        if event == "INSERT":
            statement = (
                f"INSERT INTO <table> ({', '.join(values)}) VALUES ({', '.join(values.values())})"
            )
        else:
            changes = ", ".join(f"{c} = {values[c]}" for c in columns[mode])
            statement = f"UPDATE <table> SET {changes}"
        verdicts[mode] = _verdicts(probes, mode, statement)
    # (accepted, passed over) per mode: the two differ nowhere.
    assert {mode: v for mode, v in verdicts.items() if v[0] != v[1]} == {}


BROKEN = {
    "type": "' '", "idempotency_key": "''", "unique_key": "repeat('u', 1025)",
    "group_key": "repeat('g', 2000)", "run_at": "'infinity'", "priority": "10",
    "max_attempts": "0", "timeout_seconds": "'NaN'", "payload": DEEP,
}  # fmt: skip
"""A value past the limits in every checked column."""
FIT = {
    "type": "'t2'", "idempotency_key": "'k'", "unique_key": "'u'", "group_key": "'g'",
    "run_at": "now()", "priority": "1", "max_attempts": "2", "timeout_seconds": "5",
    "payload": "'{\"a\": 1}'",
}  # fmt: skip


@pytest.mark.parametrize("column", list(BROKEN))
def test_an_update_is_checked_on_the_column_it_changes(
    probes: psycopg.Connection[Any], column: str
) -> None:
    # A row past the limits in every column (written before the checks, or
    # around them): a value within them is written to any one column, and
    # rota.job's guard lets it by without a call; one past them is refused.
    mode = "payload" if column == "payload" else "fields"
    for kind in ("check", "guard"):
        probes.execute(f"DELETE FROM {kind}_{mode}")  # type: ignore[arg-type]
        probes.execute(  # type: ignore[arg-type]
            f"INSERT INTO {kind}_{mode} ({', '.join(BROKEN)}) VALUES ({', '.join(BROKEN.values())})"
        )
    fits = _verdicts(probes, mode, f"UPDATE <table> SET {column} = {FIT[column]}")
    assert fits == (True, True)  # accepted, and the guard passed over it
    breaks = _verdicts(probes, mode, f"UPDATE <table> SET {column} = {BROKEN[column]}")
    assert breaks == (False, False)  # refused, and the guard fired


def test_the_guard_s_white_space_is_python_s(probes: psycopg.Connection[Any]) -> None:
    # A type of one character, for each of CHARS: the guard fires for exactly
    # the blank ones.
    probes.execute(
        "INSERT INTO guard_all (type, payload, priority, run_at)"
        " SELECT c, '{}', 0, now() FROM unnest(%s::text[]) AS c",
        (CHARS,),
    )
    fired = {r["type"] for r in probes.execute("SELECT type FROM pg_temp.fired")}
    assert sorted(map(ord, fired)) == [ord(c) for c in CHARS if not c.strip()]
