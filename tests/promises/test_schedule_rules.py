"""A schedule's rules, kept by the database for every writer (migration 0037).

`rota.schedule_store.validate` refuses a cron expression, a group, a timeout or
a unique_for window that the scheduler cannot use; a plain INSERT or UPDATE
stored them, and the schedule then looked fine in `rota schedule list` and
never made a job. The table's trigger now refuses them too, with 22023 and the
reason Python gives, and a next_run_at of infinity or -infinity (a schedule
that is never due, or one whose due time no reader can hold).

The cron rule is one of shape only: Python stays the parser, and the property
test below checks that the database never refuses an expression
`rota.cron.Schedule` accepts. The time zone stays Python's alone.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota import cron, schedule_store
from rota.cli import main
from rota.db import RefusedByDatabase
from rota.errors import InvalidInput
from rota.schedule_store import ScheduleSpec
from rota.scheduler import Scheduler

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from tests.web.conftest import BEARER, make_client  # noqa: E402

Conn = psycopg.Connection[Any]
NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
TIMEOUT = "timeout_seconds must be more than 0 and at most 315360000 seconds"
UNIQUE_FOR = "unique_for must be more than 0 and at most 315360000 seconds"
NEXT_RUN = "next_run_at must be from 1970-01-01 to 9999-12-30 UTC"
OVER_LONG = "repeat('0', 1017) || ' * * * *'"  # 1,025 bytes, five fields

# column, SQL value, the reason's start (the same for an INSERT and an UPDATE)
HOSTILE = [
    ("group_key", "''", "a group must be a non-empty string, not ''"),
    ("group_key", "E' \\t\\u3000'", "a group must be a non-empty string"),
    ("group_key", "repeat('g', 1025)", "a group is 1025 bytes long, over the limit of 1024"),
    ("timeout_seconds", "'Infinity'", f"{TIMEOUT}, not Infinity"),
    ("timeout_seconds", "'-Infinity'", f"{TIMEOUT}, not -Infinity"),
    ("timeout_seconds", "'NaN'", f"{TIMEOUT}, not NaN"),
    ("timeout_seconds", "0", f"{TIMEOUT}, not 0"),
    ("timeout_seconds", "315360000.5", f"{TIMEOUT}, not 315360000.5"),
    ("unique_for_seconds", "'Infinity'", f"{UNIQUE_FOR}, not Infinity"),
    ("unique_for_seconds", "'NaN'", f"{UNIQUE_FOR}, not NaN"),
    ("unique_for_seconds", "-1", f"{UNIQUE_FOR}, not -1"),
    ("unique_for_seconds", "1e300", f"{UNIQUE_FOR}, not 1e+300"),
    ("cron", "'garbage'", "invalid cron expression 'garbage': expected 5 fields, got 1"),
    ("cron", "''", "invalid cron expression '': expected 5 fields, got 1"),
    ("cron", "' \t '", "invalid cron expression '': expected 5 fields, got 1"),
    ("cron", "'* * * *'", "invalid cron expression '* * * *': expected 5 fields, got 4"),
    ("cron", "'@reboot'", "invalid cron expression '@reboot': unknown macro"),
    ("cron", "'* * * * mon;'", "invalid cron expression '* * * * mon;': day of week field"),
    ("cron", "E'\\x01 * * * *'", "invalid cron expression '\\x01 * * * *': minute field '\\x01'"),
    ("cron", "E'0 0 * * 1\\x1b[31m'", "invalid cron expression '0 0 * * 1\\x1b[31m'"),
    ("cron", OVER_LONG, "cron expression is 1025 bytes long, over the limit of 1024"),
    ("next_run_at", "'infinity'", f"{NEXT_RUN}, not infinity"),
    ("next_run_at", "'-infinity'", f"{NEXT_RUN}, not -infinity"),
    ("next_run_at", "'20000-01-01T00:00:00Z'", NEXT_RUN),
]

ROW = {"name": "'s'", "job_type": "'t'", "cron": "'* * * * *'", "next_run_at": "now()"}


def _refusal(conn: Conn, statement: str) -> str:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(statement)  # type: ignore[arg-type]
    message = caught.value.diag.message_primary
    assert message is not None
    return message


def _insert(values: dict[str, str]) -> str:
    row = {**ROW, **values}
    return f"INSERT INTO rota.schedule ({', '.join(row)}) VALUES ({', '.join(row.values())})"


def _schedules(conn: Conn) -> list[Any]:
    return conn.execute("SELECT * FROM rota.schedule ORDER BY id").fetchall()


@pytest.mark.parametrize(("column", "value", "reason"), HOSTILE)
def test_an_insert_and_an_update_refuse_alike(
    conn: Conn, column: str, value: str, reason: str
) -> None:
    schedule_store.upsert(conn, ScheduleSpec("good", "t", "0 * * * *"))
    before = _schedules(conn)
    inserted = _refusal(conn, _insert({column: value}))
    updated = _refusal(conn, f"UPDATE rota.schedule SET {column} = {value} WHERE name = 'good'")
    assert inserted.startswith(reason), inserted
    assert inserted == updated  # one rule, one message
    assert "\n" not in inserted
    assert _schedules(conn) == before


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("group_key", "repeat('g', 1024)"),
        ("group_key", "NULL"),
        ("timeout_seconds", "1e-9"),
        ("timeout_seconds", "315360000"),
        ("unique_for_seconds", "1e-9"),
        ("unique_for_seconds", "315360000"),
        ("cron", "repeat('0', 1016) || ' * * * *'"),  # 1,024 bytes
        ("cron", "E'\\u3000@WeeKLY\\t'"),
        ("cron", "E'@wee\\u212aly'"),  # the Kelvin sign, whose lower case is k
        ("cron", "E'\\x1c*/5\\u00a0 9-17 ? JAN,jul MON-fri\\n'"),
        ("cron", "'0 0 ? * 1'"),
        ("next_run_at", "'1970-01-01T00:00:00Z'"),
        ("next_run_at", "'9999-12-30T00:00:00Z'"),
    ],
)
def test_the_edges_are_stored(conn: Conn, column: str, value: str) -> None:
    conn.execute(_insert({column: value}))  # type: ignore[arg-type]
    stored = conn.execute(f"SELECT {column} AS v FROM rota.schedule WHERE name = 's'").fetchone()  # type: ignore[arg-type]
    assert stored is not None
    if column == "cron":
        cron.Schedule(stored["v"], "UTC")  # Python takes it too


@pytest.mark.parametrize(
    ("fields", "column", "value"),
    [
        ({"group": ""}, "group_key", "''"),
        ({"group": "g" * 1025}, "group_key", "repeat('g', 1025)"),
        ({"cron": "garbage"}, "cron", "'garbage'"),
        ({"cron": "* * * *"}, "cron", "'* * * *'"),
        ({"cron": "@reboot"}, "cron", "'@reboot'"),
        ({"cron": "* * * * mon;"}, "cron", "'* * * * mon;'"),
        ({"cron": "0" * 1017 + " * * * *"}, "cron", OVER_LONG),
    ],
)
def test_python_refuses_first_in_the_same_words(
    conn: Conn, fields: dict[str, Any], column: str, value: str
) -> None:
    spec = ScheduleSpec(**{"name": "s", "job_type": "t", "cron": "* * * * *", **fields})
    with pytest.raises(InvalidInput) as caught:
        schedule_store.upsert(conn, spec)
    assert not isinstance(caught.value, RefusedByDatabase)  # Python's own check
    assert str(caught.value) == _refusal(conn, _insert({column: value}))


@pytest.mark.parametrize(
    ("fields", "literal", "sql_reason"),
    [
        ({"timeout_seconds": float("inf")}, "'Infinity'", TIMEOUT),
        ({"timeout_seconds": float("nan")}, "'NaN'", TIMEOUT),
        ({"timeout_seconds": 0}, "0", TIMEOUT),
        ({"unique_for_seconds": float("nan")}, "'NaN'", UNIQUE_FOR),
        ({"unique_for_seconds": 315360001}, "315360001", UNIQUE_FOR),
    ],
)
def test_python_refuses_every_timeout_and_window_the_database_refuses(
    conn: Conn, fields: dict[str, Any], literal: str, sql_reason: str
) -> None:
    spec = ScheduleSpec(**{"name": "s", "job_type": "t", "cron": "* * * * *", **fields})
    [column] = fields
    label = "timeout_seconds" if column == "timeout_seconds" else "unique_for"
    with pytest.raises(InvalidInput, match=f"^{label} must be "):
        schedule_store.validate(spec)
    assert _refusal(conn, _insert({column: literal})).startswith(sql_reason)


GARBAGE = [
    "garbage",
    "",
    "   ",
    "* * * *",
    "* * * * * *",
    "@reboot",
    "@hourly *",
    "\x01 * * * *",
    "* * * * *\x7f",
    "0 0 * * 1\x1b[2J",
    "0 0 \u200b * *",
    "0 0 1 1 1; DROP TABLE rota.job",
    "1.5 * * * *",
    "0 0 * * 5#2",  # Python refuses it (not classic cron), the shape refuses '#'
    "0" * 1017 + " * * * *",
    "* * * * *" + " " * 2000,
]


@pytest.mark.parametrize("expr", GARBAGE, ids=[ascii(e)[:40] for e in GARBAGE])
def test_obvious_garbage_is_refused(conn: Conn, expr: str) -> None:
    with pytest.raises(InvalidInput):
        cron.Schedule(expr, "UTC")
    reason = _cron_refusal(conn, expr)
    assert reason is not None and "cron expression" in reason, reason


# -- Python accepts, the database accepts ------------------------------------------

WHITESPACE = [c for c in map(chr, range(0x3001)) if c.isspace()]
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
FIELDS = [(0, 59, []), (0, 23, []), (1, 31, []), (1, 12, MONTHS), (0, 7, DAYS)]
ODD = [
    "?", "R", "r", "W", "w", "L", "l", "H", "h", "#", "K", "k", "\u212a", "\u0130", "é", "\u0663",
    ";", ".", "_", "+", "%", "@", "'", '"', "\\", "\x01", "\x7f", "\x85", "\u200b", "\ufeff",
]  # fmt: skip
MACROS = [*cron.MACROS, "@reboot", "@every", "@week"]


@st.composite
def spelled(draw: st.DrawFn, word: str) -> str:
    """The word in any case, a k sometimes as the Kelvin sign (whose lower case is k)."""
    return "".join(
        draw(st.sampled_from([c.lower(), c.upper(), *(["\u212a"] if c.lower() == "k" else [])]))
        for c in word
    )


def _value(low: int, high: int, names: list[str]) -> st.SearchStrategy[str]:
    numbers = st.integers(low, high).map(str)
    return st.one_of(
        numbers,
        numbers,
        st.integers(0, 99).map(str),
        st.tuples(st.integers(1, 4), st.integers(low, high)).map(lambda z: "0" * z[0] + str(z[1])),
        *([st.sampled_from(names).flatmap(spelled)] if names else []),
    )


def _item(field: int) -> st.SearchStrategy[str]:
    value = _value(*FIELDS[field])
    start = st.one_of(value, st.just("*"))
    return st.one_of(
        st.just("*"),
        value,
        value,
        st.tuples(value, value).map("-".join),
        st.tuples(start, st.integers(0, 70)).map(lambda s: f"{s[0]}/{s[1]}"),
        st.tuples(value, value, st.integers(1, 9)).map(lambda s: f"{s[0]}-{s[1]}/{s[2]}"),
        st.just("?"),
        st.sampled_from(["R", "r", "R(0-5)", "r(1-3)/2", "H", "15W", "w3", "L", "5#2", "l5"]),
        st.tuples(value, st.sampled_from(ODD)).map("".join),
        st.tuples(st.sampled_from(ODD), value).map("".join),
    )


def _field(field: int) -> st.SearchStrategy[str]:
    return st.lists(_item(field), min_size=1, max_size=3).map(",".join)


SPACE = st.lists(st.sampled_from(WHITESPACE), min_size=1, max_size=3).map("".join)
EDGE = st.one_of(st.just(""), SPACE)


@st.composite
def expressions(draw: st.DrawFn) -> str:
    """Five fields (now and then four or six) between odd whitespace."""
    count = draw(st.sampled_from([5, 5, 5, 5, 4, 6]))
    fields = [draw(_field(min(i, 4))) for i in range(count)]
    text = draw(EDGE)
    for i, field in enumerate(fields):
        text += (draw(SPACE) if i else "") + field
    return text + draw(EDGE)


MACRO = st.tuples(EDGE, st.sampled_from(MACROS).flatmap(spelled), EDGE).map("".join)
NOISE = st.lists(
    st.sampled_from([*"0123456789*/,-? ", *ODD, *WHITESPACE, "mon", "JAN", "@"]), max_size=40
).map("".join)
LONG = st.one_of(
    st.integers(1000, 1040).map(lambda n: "0" * (n - 8) + " * * * *"),
    st.integers(1000, 1040).map(lambda n: "* * * * *" + " " * (n - 9)),
)
CRON_LIKE = st.one_of(expressions(), expressions(), expressions(), MACRO, NOISE, LONG)

SHAPE_REASONS = re.compile(r"expected 5 fields|unknown macro|bytes long, over the limit")


def _cron_refusal(conn: Conn, expr: str) -> str | None:
    """The database's reason for refusing a schedule of this cron (None: stored),
    the insert rolled back either way."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(
                "INSERT INTO rota.schedule (name, job_type, cron, next_run_at)"
                " VALUES ('p', 't', %s, now())",
                (expr,),
            )
    except psycopg.errors.InvalidParameterValue as exc:
        return exc.diag.message_primary or "?"
    return None


def _python_refusal(expr: str) -> str | None:
    try:
        cron.Schedule(expr, "UTC")
    except InvalidInput as exc:
        return str(exc)
    return None


def test_the_database_never_refuses_a_cron_python_accepts(conn: Conn) -> None:
    accepted: list[str] = []

    @settings(
        max_examples=int(os.environ.get("ROTA_PROPERTY_EXAMPLES") or 600),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(expr=CRON_LIKE)
    def agree(expr: str) -> None:
        python = _python_refusal(expr)
        sql = _cron_refusal(conn, expr)
        if python is None:
            accepted.append(expr)
            assert sql is None, (expr, sql)
        if sql is not None and SHAPE_REASONS.search(sql) and expr.isascii():
            assert sql == python  # the same words, where the shape decides

    agree()
    assert len(accepted) >= 100, len(accepted)  # the property was not vacuous


# -- changed columns only, and the scheduler beside rows written around the checks --

AROUND_THE_CHECKS = """
SET session_replication_role = replica;
INSERT INTO rota.schedule (name, job_type, cron, next_run_at, group_key, timeout_seconds,
                           unique_for_seconds)
VALUES ('bad-cron', 't', 'garbage', %(due)s, NULL, NULL, NULL),
       ('bad-group', 't', '* * * * *', %(due)s, '', NULL, NULL),
       ('bad-timeout', 't', '* * * * *', %(due)s, NULL, 'Infinity', NULL),
       ('bad-nan', 't', '* * * * *', %(due)s, NULL, 'NaN', NULL),
       ('bad-window', 't', '* * * * *', %(due)s, NULL, NULL, 'NaN'),
       ('bad-next', 't', '* * * * *', '-infinity', NULL, NULL, NULL),
       ('bad-never', 't', '* * * * *', 'infinity', NULL, NULL, NULL);
RESET session_replication_role;
"""
BAD = ["bad-cron", "bad-group", "bad-timeout", "bad-nan", "bad-window", "bad-next", "bad-never"]


def _written_around(conn: Conn) -> None:
    for statement in AROUND_THE_CHECKS.strip().split(";\n"):
        conn.execute(statement, {"due": NOW - timedelta(minutes=1)})  # type: ignore[arg-type]


def test_an_update_is_checked_on_the_columns_it_changes(conn: Conn) -> None:
    _written_around(conn)
    # What the scheduler, a rename or a suspend writes leaves a bad column alone.
    conn.execute("UPDATE rota.schedule SET next_run_at = %s, suspend = true", (NOW,))
    conn.execute(
        "UPDATE rota.schedule SET name = name || '-old', cron = cron, group_key = group_key"
    )
    conn.execute(
        "UPDATE rota.schedule SET timeout_seconds = timeout_seconds,"
        " unique_for_seconds = unique_for_seconds"
    )
    # A change to a value past a rule is refused as on an insert.
    assert _refusal(conn, "UPDATE rota.schedule SET group_key = ' '").startswith("a group")
    assert _refusal(conn, "UPDATE rota.schedule SET cron = 'x'").startswith(
        "invalid cron expression 'x'"
    )


def test_the_scheduler_runs_the_good_schedules_beside_bad_rows(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    for name, expr in [("good-minute", "* * * * *"), ("good-hourly", "0 * * * *")]:
        schedule_store.upsert(conn, ScheduleSpec(name, "t", expr), now=NOW - timedelta(hours=1))
    _written_around(conn)
    scheduler = Scheduler()
    caplog.set_level(logging.ERROR, logger="rota.scheduler")
    # bad-next is passed over once: its slot after that is one like any other.
    for tick, more in [(NOW, []), (NOW + timedelta(hours=1), ["bad-next"])]:
        scheduler.run_once(conn, now=tick)
        fired = conn.execute(
            "SELECT s.name FROM rota.job AS j JOIN rota.schedule AS s ON s.id = j.schedule_id"
            " WHERE j.slot = %s ORDER BY s.name",
            (tick,),
        ).fetchall()
        assert [r["name"] for r in fired] == [*more, "good-hourly", "good-minute"]
    assert "schedule 'bad-cron' cannot be computed" in caplog.text
    assert "schedule 'bad-group': the database refused its slot" in caplog.text
    left = conn.execute(
        "SELECT name, next_run_at::text AS next FROM rota.schedule WHERE name LIKE 'bad-%%'"
    ).fetchall()
    assert {r["name"] for r in left} == set(BAD)  # passed over, none refused its advance
    assert {r["name"]: r["next"] for r in left}["bad-never"] == "infinity"


# -- every door: Python's words first, the database's refusal as InvalidInput -------


def test_a_refusal_by_the_database_is_invalid_input_at_every_door(
    db_url: str,
    conn: Conn,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reason = "a group must be a non-empty string, not ''"
    # With Python's check out of the way, the database's rule still holds.
    monkeypatch.setattr(schedule_store, "validate", lambda spec: None)
    with pytest.raises(RefusedByDatabase, match=f"^{reason}$"):
        schedule_store.upsert(conn, ScheduleSpec("s", "t", "* * * * *", group=""))
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    capsys.readouterr()
    assert main(["schedule", "add", "s", "--type", "t", "--cron", "@daily", "--group", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err, err
    assert [r["name"] for r in schedule_store.list_all(conn)] == ["rota/archive"]
    monkeypatch.undo()

    # The console: rows written around the checks are refused, never a 500.
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        "INSERT INTO rota.schedule (name, job_type, cron, next_run_at, group_key, timeout_seconds)"
        " VALUES ('old-group', 't', '* * * * *', now(), '', NULL),"
        "        ('old-timeout', 't', '* * * * *', now(), NULL, 'Infinity')"
    )
    conn.execute("RESET session_replication_role")
    form = {"Content-Type": "application/x-www-form-urlencoded", **BEARER}
    with make_client(db_url) as client:
        resumed = client.post("/schedules/resume", content="name=old-group", headers=form)
        assert resumed.status_code == 400 and reason in resumed.text, resumed.text
        ran = client.post("/schedules/old-timeout/run", headers=form)
        assert ran.status_code == 400 and "timeout must be more than 0" in ran.text, ran.text
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone() == {"n": 0}
