"""Hostile input at every entry point: refused with InvalidInput (exit 2 from the
CLI, 400 from the console), one line, and nothing written.

Each entry point names the kind of value it takes in one place (a name, a
time, a whole number, seconds, a payload, a zone, a list of types); hypothesis
draws hostile values of that kind and the test checks exactly the contract:
the error's kind, and that no table changed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rota
from rota import control, limits, lookup, schedule_store
from rota.cli import main
from rota.effects import record_effect
from rota.errors import InvalidInput
from rota.jobs import Job, Status
from rota.schedule_store import ScheduleSpec

# -- hostile values, by kind -------------------------------------------------------

_LONG = "x" * (limits.MAX_NAME_BYTES + 1)
_WIDE = "é" * (limits.MAX_NAME_BYTES // 2 + 1)  # under the limit in characters, over in bytes

NAMES = st.one_of(
    st.sampled_from(["", "   ", "a\x00b", "\udcff", "ok\ud800", _LONG, _WIDE]),
    st.text(min_size=1, max_size=5).map(lambda t: t + "\x00"),
    st.text(min_size=1, max_size=5).map(lambda t: t + "\udc80"),
    st.integers(),
    st.binary(min_size=1, max_size=5),
)
"""A job type, key, effect or schedule name no index or column can hold."""

_WEST, _EAST = timezone(-timedelta(hours=5)), timezone(timedelta(hours=14))
INSTANTS = st.one_of(
    st.sampled_from(
        [
            datetime(9999, 12, 31, 23, 59, 59, tzinfo=_WEST),
            datetime(1, 1, 1, tzinfo=_EAST),
            datetime(9999, 12, 31, 12, tzinfo=UTC),
            datetime(1969, 12, 31, tzinfo=UTC),
        ]
    ),
    st.datetimes(max_value=datetime(1969, 12, 31), timezones=st.just(UTC)),
    st.datetimes(min_value=datetime(9999, 12, 30, 0, 0, 1), timezones=st.just(UTC)),
    st.datetimes(timezones=st.none()),  # naive
)
"""Times PostgreSQL or Python cannot hold both ways, or that name no instant."""

WHOLE = st.one_of(
    st.integers(min_value=limits.INTEGER_MAX + 1),
    st.integers(max_value=0),
    st.sampled_from([2**31, 2**63, 2**64, True]),
    st.floats(allow_nan=True, allow_infinity=True),
)
"""Whole numbers an int4 column refuses, or values that are not whole numbers."""

IDS = st.one_of(
    st.integers(min_value=limits.BIGINT_MAX + 1),
    st.integers(max_value=0),
    st.sampled_from([True, 1.0, "1"]),
)
"""Job ids a bigint column cannot hold, or that are not whole numbers."""

SECONDS = st.one_of(
    st.sampled_from([1e308, float("inf"), float("-inf"), float("nan"), -1.0]),
    st.floats(min_value=limits.MAX_SECONDS * 1.001, allow_infinity=False),
)

_DEEP: Any = {}
for _ in range(1000):
    _DEEP = {"a": _DEEP}
_LOOP: list[Any] = []
_LOOP.append(_LOOP)
PAYLOADS = st.sampled_from([_DEEP, [_DEEP], {"k": "\x00"}, {"\udcff": 1}, ["\ud800"], _LOOP, {1.5}])
ZONES = st.sampled_from(
    ["localtime", "/etc/localtime", "posixrules", "Factory", "posix/Europe/Berlin",
     "right/UTC", "../zoneinfo/UTC", "", " UTC", "Europe/Nowhere", "UTC\x00"]
)  # fmt: skip
TYPE_LISTS = st.one_of(st.sampled_from(["abc", b"abc"]), st.lists(NAMES, min_size=1, max_size=3))

# -- the entry points --------------------------------------------------------------

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SPEC = ScheduleSpec("s", "t", "0 * * * *")
JOB = Job(1, "t", {}, "k", Status.RUNNING, T0, 1, 3)

Call = Callable[[psycopg.Connection[Any], Any], object]
API: dict[str, tuple[st.SearchStrategy[Any], Call]] = {
    "enqueue type": (NAMES, lambda c, v: rota.enqueue(c, v)),
    "enqueue key": (NAMES, lambda c, v: rota.enqueue(c, "t", key=v)),
    "enqueue run_at": (INSTANTS, lambda c, v: rota.enqueue(c, "t", run_at=v)),
    "enqueue max_attempts": (WHOLE, lambda c, v: rota.enqueue(c, "t", max_attempts=v)),
    "enqueue delay": (SECONDS, lambda c, v: rota.enqueue(c, "t", delay=v)),
    "enqueue timeout": (SECONDS, lambda c, v: rota.enqueue(c, "t", timeout=v)),
    "enqueue payload": (PAYLOADS, lambda c, v: rota.enqueue(c, "t", v)),
    "enqueue_many": (
        NAMES,
        lambda c, v: rota.enqueue_many(c, [rota.NewJob("ok"), rota.NewJob("t", key=v)]),
    ),
    "schedule name": (NAMES, lambda c, v: schedule_store.upsert(c, _spec(name=v))),
    "schedule type": (NAMES, lambda c, v: schedule_store.upsert(c, _spec(job_type=v))),
    "schedule zone": (ZONES, lambda c, v: schedule_store.upsert(c, _spec(timezone=v))),
    "schedule deadline": (
        WHOLE,
        lambda c, v: schedule_store.upsert(c, _spec(starting_deadline_seconds=v)),
    ),
    "schedule spread": (
        st.integers(min_value=limits.INTEGER_MAX + 1),
        lambda c, v: schedule_store.upsert(c, _spec(spread_seconds=v)),
    ),
    "schedule timeout": (SECONDS, lambda c, v: schedule_store.upsert(c, _spec(timeout_seconds=v))),
    "schedule payload": (PAYLOADS, lambda c, v: schedule_store.upsert(c, _spec(payload=v))),
    "pause": (TYPE_LISTS, lambda c, v: control.pause(c, v)),
    "resume": (TYPE_LISTS, lambda c, v: control.resume(c, v)),
    "cancel ids": (
        st.one_of(st.just("12"), st.lists(IDS, min_size=1, max_size=2)),
        lambda c, v: control.cancel(c, v),
    ),
    "cancel type": (NAMES, lambda c, v: control.cancel_matching(c, v)),
    "retry ids": (st.lists(IDS, min_size=1, max_size=2), lambda c, v: control.retry(c, v)),
    "list type": (NAMES, lambda c, v: lookup.list_jobs(c, job_type=v)),
    "get id": (IDS, lambda c, v: lookup.get_job(c, v)),
    "effect": (NAMES, lambda c, v: record_effect(c, JOB, v)),
}


def _spec(**changes: Any) -> ScheduleSpec:
    return dataclasses.replace(SPEC, **changes)


def _written(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM rota.job), (SELECT count(*) FROM rota.schedule),"
        " (SELECT count(*) FROM rota.paused_type), (SELECT count(*) FROM rota.job_effect)"
    ).fetchone()
    assert row is not None
    return tuple(row.values())


_MANY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_MANY
@given(data=st.data())
@pytest.mark.parametrize("entry", sorted(API))
def test_the_python_api_refuses_hostile_values_and_writes_nothing(
    conn: psycopg.Connection[Any], entry: str, data: st.DataObject
) -> None:
    kind, call = API[entry]
    value = data.draw(kind, label=entry)
    before = _written(conn)
    with pytest.raises(InvalidInput) as raised:
        call(conn, value)
    assert "\n" not in str(raised.value)
    assert _written(conn) == before


# -- the command line, in process (argv as the OS decodes it) ---------------------

_CLI_NAMES = NAMES.filter(lambda v: isinstance(v, str) and not v.startswith("-"))
_CLI_TIMES = st.sampled_from(
    ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+14:00", "9999-12-31", "1969-12-31"]
)
_CLI_INTS = st.one_of(st.integers(min_value=limits.INTEGER_MAX + 1), st.integers(max_value=0)).map(
    str
)
_CLI_SECONDS = st.sampled_from(["1e308", "nan", "inf", "-inf", "-1", "1e9"])
_DEEP_TEXT = "[" * 5000 + "]" * 5000

Argv = Callable[[Any], list[str]]


def _add(name: str = "s", job_type: str = "t", *extra: str) -> list[str]:
    return ["schedule", "add", name, "--type", job_type, "--cron", "@daily", *extra]


CLI: dict[str, tuple[st.SearchStrategy[Any], Argv]] = {
    "enqueue type": (_CLI_NAMES, lambda v: ["enqueue", v]),
    "enqueue key": (_CLI_NAMES, lambda v: ["enqueue", "t", "--key", v]),
    "enqueue --run-at": (_CLI_TIMES, lambda v: ["enqueue", "t", "--run-at", v]),
    "enqueue --max-attempts": (_CLI_INTS, lambda v: ["enqueue", "t", "--max-attempts", v]),
    "enqueue --priority": (
        st.sampled_from(["10", "-1", str(2**31), str(2**63)]),
        lambda v: ["enqueue", "t", "--priority", v],
    ),
    "enqueue --delay": (_CLI_SECONDS, lambda v: ["enqueue", "t", "--delay", v]),
    "enqueue --timeout": (_CLI_SECONDS, lambda v: ["enqueue", "t", "--timeout", v]),
    "enqueue --payload": (
        st.sampled_from([_DEEP_TEXT, '{"a": "\\u0000"}', '["\\ud800"]', "\udcff"]),
        lambda v: ["enqueue", "t", "--payload", v],
    ),
    "schedule add name": (_CLI_NAMES, lambda v: _add(v)),
    "schedule add --type": (_CLI_NAMES, lambda v: _add("s", v)),
    "schedule add --timezone": (
        ZONES.filter(lambda v: not v.startswith("-")),
        lambda v: _add("s", "t", "--timezone", v),
    ),
    "schedule add --starting-deadline-seconds": (
        st.sampled_from(["99999999999999", str(2**31), "0"]),
        lambda v: _add("s", "t", "--starting-deadline-seconds", v),
    ),
    "schedule add --spread-seconds": (
        st.sampled_from([str(2**31), "-1"]),
        lambda v: _add("s", "t", "--spread-seconds", v),
    ),
    "schedule add rota/": (st.sampled_from(["rota/mine", "rota/archive"]), lambda v: _add(v)),
    "schedule remove rota/archive": (st.just("rota/archive"), lambda v: ["schedule", "remove", v]),
    "schedule preview --from": (
        _CLI_TIMES,
        lambda v: ["schedule", "preview", "--cron", "@daily", "--from", v],
    ),
    "pause": (_CLI_NAMES, lambda v: ["pause", v]),
    "resume": (_CLI_NAMES, lambda v: ["resume", v]),
    "jobs list --type": (_CLI_NAMES, lambda v: ["jobs", "list", "--type", v]),
    "jobs list --limit": (_CLI_INTS, lambda v: ["jobs", "list", "--limit", v]),
    "jobs show": (st.sampled_from([str(2**63), "0", "-1"]), lambda v: ["jobs", "show", "--", v]),
    "jobs cancel": (st.sampled_from([str(2**63), str(2**64)]), lambda v: ["jobs", "cancel", v]),
    "jobs cancel --type": (_CLI_NAMES, lambda v: ["jobs", "cancel", "--type", v]),
    "dead retry": (st.sampled_from([str(2**63), "0"]), lambda v: ["dead", "retry", "--", v]),
    "migrate --grant": (
        st.sampled_from(["pg_read_all_data", "pg_monitor", "pg_write_all_data", "\udcff"]),
        lambda v: ["migrate", "--grant", v],
    ),
    "worker --lease": (_CLI_SECONDS, lambda v: ["worker", "--lease", v]),
    "worker --concurrency": (_CLI_INTS, lambda v: ["worker", "--concurrency", v]),
}


@_MANY
@given(data=st.data())
@pytest.mark.parametrize("entry", sorted(CLI))
def test_the_cli_refuses_hostile_values_with_exit_2_one_line_nothing_written(
    conn: psycopg.Connection[Any],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    entry: str,
    data: st.DataObject,
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    kind, argv = CLI[entry]
    args = argv(data.draw(kind, label=entry))
    before = _written(conn)
    capsys.readouterr()
    assert main(args) == 2, args
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("rota: error: "), err
    assert _written(conn) == before


def test_undecodable_bytes_on_the_real_command_line_are_exit_2(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    env = {**os.environ, "ROTA_DATABASE_URL": db_url}
    rota_cmd = [sys.executable, "-m", "rota"]
    before = _written(conn)
    for argv in ([b"enqueue", b"caf\xe9"], [b"enqueue", b"t", b"--key", b"\xff\xfe"]):
        result = subprocess.run(rota_cmd + argv, env=env, capture_output=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert b"UTF-8" in result.stderr
    assert _written(conn) == before


def test_values_at_the_limits_are_accepted(conn: psycopg.Connection[Any]) -> None:
    """The documented edges themselves are fine, and read back."""
    top = rota.enqueue(conn, "é" * (limits.MAX_NAME_BYTES // 2), run_at=limits.MAX_INSTANT)
    bottom = rota.enqueue(conn, "t", key="k" * limits.MAX_NAME_BYTES, run_at=limits.MIN_INSTANT)
    deep: Any = 1
    for _ in range(limits.MAX_JSON_DEPTH - 1):
        deep = [deep]
    rota.enqueue(conn, "t", deep, max_attempts=limits.INTEGER_MAX, delay=limits.MAX_SECONDS)
    assert len(lookup.list_jobs(conn)) == 3
    assert lookup.get_job(conn, top).run_at == limits.MAX_INSTANT
    assert lookup.get_job(conn, bottom).run_at == limits.MIN_INSTANT
    schedule_store.upsert(conn, _spec(timezone="America/New_York", spread_seconds=2**31 - 1))


def test_the_console_refuses_hostile_values_with_400(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    from tests.web.conftest import BEARER, make_client

    before = _written(conn)
    with make_client(db_url) as client:
        for query in (
            "created_from=9999-12-31T23:59:59-05:00",
            "created_to=0001-01-01T00:00+14:00",
        ):
            assert client.get(f"/jobs?{query}", headers=BEARER).status_code == 400, query
    assert _written(conn) == before
