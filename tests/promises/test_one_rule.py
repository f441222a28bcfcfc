"""One rule through every door: the same hostile value, the same refusal.

Hypothesis draws a hostile job (one value past a limit of docs/limits.md) and
drives it through every way a job gets in: the Python API (sync, async, a
batch), rota.enqueue() in SQL, `rota enqueue`, a plain INSERT and a plain
UPDATE of an existing job. Each must refuse it the same way: InvalidInput (the
SQL doors: SQLSTATE 22023; the CLI: exit 2 and one line on stderr) whose reason
states the same rule, and nothing written. (The Django backend goes through
rota.enqueue; tests/django_tasks drives it. The console has no enqueue form.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

import rota
from rota import limits
from rota.cli import main
from rota.errors import InvalidInput

LATEST = datetime(9999, 12, 30, tzinfo=UTC)


@dataclasses.dataclass(frozen=True)
class Hostile:
    """One job with one value past a limit; `rule` is what every refusal says."""

    rule: str
    column: str
    value: Any
    sql: Any = None
    """The value as SQL takes it when Python's form cannot go there as is."""

    def of(self, column: str, default: Any) -> Any:
        return self.value if column == self.column else default


def _nested(depth: int) -> tuple[Any, str]:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value, "[" * depth + "]" * depth


def _deep(depth: int) -> Hostile:
    value, text = _nested(depth)
    return Hostile("payload is nested more than 100 levels deep", "payload", value, text)


WHITESPACE = [c for c in map(chr, range(0x3001)) if c.isspace()]

HOSTILE = st.one_of(
    st.lists(st.sampled_from(WHITESPACE), min_size=1, max_size=4).map(
        lambda cs: Hostile("job type must be a non-empty string", "type", "".join(cs))
    ),
    st.integers(limits.MAX_NAME_BYTES + 1, 3000).map(
        lambda n: Hostile(f"job type is {n} bytes long, over the limit of 1024", "type", "t" * n)
    ),
    st.integers(limits.MAX_NAME_BYTES // 2 + 1, 1500).map(
        lambda n: Hostile(
            f"an idempotency key is {2 * n} bytes long, over the limit of 1024", "key", "é" * n
        )
    ),
    st.integers(limits.MAX_JSON_DEPTH + 1, 5000).map(_deep),
    st.integers(limits.MAX_PAYLOAD_BYTES, 400_000).map(
        lambda n: Hostile(
            r"payload is \d+ bytes, over the limit of 262144 bytes", "payload", {"x": "a" * n}
        )
    ),
    st.one_of(st.integers(10, 32767), st.integers(-32768, -1)).map(
        lambda p: Hostile(
            f"must be a whole number from 0 \\(first\\) to 9, not {p}$", "priority", p
        )
    ),
    st.integers(-(2**31), 0).map(
        lambda n: Hostile(f"must be a whole number of at least 1, not {n}$", "max_attempts", n)
    ),
    st.one_of(
        st.integers(1, 86399).map(lambda s: LATEST + timedelta(seconds=s)),
        st.datetimes(datetime(1, 1, 2), datetime(1969, 12, 31), timezones=st.just(UTC)),
    ).map(lambda at: Hostile("run.at must be from 1970-01-01 to 9999-12-30 UTC", "run_at", at)),
)


# -- the doors ------------------------------------------------------------------------


def _python(job: Hostile) -> dict[str, Any]:
    return {
        "job_type": job.of("type", "t"),
        "payload": job.of("payload", {"n": 1}),
        "key": job.of("key", None),
        "priority": job.of("priority", None),
        "max_attempts": job.of("max_attempts", None),
        "run_at": job.of("run_at", None),
    }


def python_sync(url: str, job: Hostile) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        rota.enqueue(conn, **_python(job))


def python_async(url: str, job: Hostile) -> None:
    kwargs = _python(job)
    asyncio.run(rota.enqueue_async(url, kwargs.pop("job_type"), **kwargs))


def python_batch(url: str, job: Hostile) -> None:
    kwargs = _python(job)
    fine = rota.NewJob("t", {"n": 2})
    rota.enqueue_many(url, [fine, rota.NewJob(kwargs.pop("job_type"), **kwargs)])


def _sql_value(job: Hostile, column: str, default: Any) -> Any:
    if column != job.column:
        return default
    if column == "payload":
        return job.sql if job.sql is not None else json.dumps(job.value)
    return job.value


def _refused_by_sql(url: str, statement: str, params: dict[str, Any]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute(statement, params)  # type: ignore[arg-type]
        except psycopg.errors.InvalidParameterValue as exc:
            raise InvalidInput(exc.diag.message_primary) from exc


def _sql_params(job: Hostile) -> dict[str, Any]:
    return {
        "type": _sql_value(job, "type", "t"),
        "payload": _sql_value(job, "payload", '{"n": 1}'),
        "key": _sql_value(job, "key", None),
        "priority": _sql_value(job, "priority", 0),
        "max_attempts": _sql_value(job, "max_attempts", None),
        "run_at": _sql_value(job, "run_at", None),
    }


def sql_function(url: str, job: Hostile) -> None:
    _refused_by_sql(
        url,
        "SELECT rota.enqueue(%(type)s, %(payload)s::jsonb, %(key)s, %(run_at)s::timestamptz,"
        " %(priority)s::int, %(max_attempts)s::int)",
        _sql_params(job),
    )


def sql_insert(url: str, job: Hostile) -> None:
    _refused_by_sql(
        url,
        "INSERT INTO rota.job (type, payload, idempotency_key, run_at, priority, max_attempts)"
        " VALUES (%(type)s, %(payload)s::jsonb, %(key)s,"
        " coalesce(%(run_at)s::timestamptz, now()), %(priority)s::smallint,"
        " coalesce(%(max_attempts)s::int, 20))",
        _sql_params(job),
    )


_COLUMN = {"key": "idempotency_key"}


def sql_update(url: str, job: Hostile) -> None:
    column = _COLUMN.get(job.column, job.column)
    cast = {"payload": "::jsonb", "run_at": "::timestamptz", "priority": "::smallint"}
    value = _sql_value(job, job.column, None)
    _refused_by_sql(
        url,
        f"UPDATE rota.job SET {column} = %(v)s{cast.get(job.column, '')} WHERE type = 'ordinary'",
        {"v": value},
    )


def cli(url: str, job: Hostile) -> None:
    argv = ["enqueue", job.of("type", "t"), "--payload", _sql_value(job, "payload", "{}")]
    flags = {"key": "--key", "priority": "--priority", "max_attempts": "--max-attempts"}
    if job.column in flags:
        argv += [f"{flags[job.column]}={job.value}"]
    if job.column == "run_at":
        argv += ["--run-at", job.value.isoformat()]
    code = main(argv)
    raise _CliExit(code)


class _CliExit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


DOORS: list[Callable[[str, Hostile], None]] = [
    python_sync, python_async, python_batch, sql_function, sql_insert, sql_update, cli,
]  # fmt: skip


def _written(conn: psycopg.Connection[Any]) -> list[Any]:
    return conn.execute(
        "SELECT id, type, payload::text, run_at FROM rota.job ORDER BY id"
    ).fetchall()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(job=HOSTILE)
def test_every_door_refuses_the_same_hostile_job_alike(
    db_url: str,
    conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    job: Hostile,
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    conn.execute("DELETE FROM rota.job")
    conn.execute("INSERT INTO rota.job (type, payload) VALUES ('ordinary', %s)", (Jsonb({}),))
    before = _written(conn)
    capsys.readouterr()
    for door in DOORS:
        try:
            door(db_url, job)
        except InvalidInput as exc:
            reason = str(exc)
        except _CliExit as exit_:
            err = capsys.readouterr().err
            assert exit_.code == 2 and err.count("\n") == 1, (job.rule, err)
            reason = err
        else:
            raise AssertionError(f"{door.__name__} took {job.rule!r}")
        assert re.search(job.rule, reason.strip()), (door.__name__, job.rule, reason[:300])
        assert _written(conn) == before, door.__name__
