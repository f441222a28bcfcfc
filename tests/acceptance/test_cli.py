"""The `rota` command line as scripts use it: output, exit codes, nothing lost on bad input."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.acceptance.procs import rota


def count(conn: psycopg.Connection[Any]) -> int:
    return conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"]  # type: ignore[index]


def test_enqueue_prints_the_id_and_a_known_key_prints_the_same_id(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    first = rota(db_url, "enqueue", "email.send", "--payload", '{"to": "a@b.c"}', "--key", "k-1")
    assert first.returncode == 0, first.stderr
    again = rota(db_url, "enqueue", "email.send", "--key", "k-1")
    assert again.returncode == 0
    assert first.stdout.strip() == again.stdout.strip() == "1"
    delayed = rota(db_url, "enqueue", "t", "--delay", "60", "--max-attempts", "3")
    at = rota(db_url, "enqueue", "t", "--run-at", "2031-01-01T00:00:00Z")
    assert delayed.returncode == at.returncode == 0
    row = conn.execute(
        "SELECT max_attempts, run_at > now() AS later FROM rota.job WHERE id = %s",
        (int(delayed.stdout),),
    ).fetchone()
    assert row == {"max_attempts": 3, "later": True}


@pytest.mark.parametrize(
    ("args", "extra_env", "message"),
    [
        (["enqueue", "t", "--payload", "{not json"], {}, "not valid JSON"),
        (["enqueue", "t", "--delay", "-5"], {}, "must not be negative"),
        (["enqueue", "t", "--delay", "1e12"], {}, "at most"),
        (["enqueue", "t", "--payload", '{"a": "\\u0000"}'], {}, "NUL"),
        (["enqueue", "t", "--run-at", "yesterday"], {}, "ISO-8601"),
        (["enqueue", "t", "--max-attempts", "0"], {}, "at least 1"),
        (
            ["enqueue", "t", "--payload", '{"b": "' + "x" * 300 + '"}'],
            {"ROTA_MAX_PAYLOAD_BYTES": "100"},
            "over the limit of 100 bytes",
        ),
        (["jobs", "list", "--status", "sleeping"], {}, "unknown status"),
        (["jobs", "show", "abc"], {}, "not a job id"),
        (["dead", "retry"], {}, "give job ids or --all: rota dead retry ID"),
        (["no-such-command"], {}, "invalid choice"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    db_url: str,
    conn: psycopg.Connection[Any],
    args: list[str],
    extra_env: dict[str, str],
    message: str,
) -> None:
    result = rota(db_url, *args, **extra_env)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert count(conn) == 0


def test_jobs_list_show_and_dead_retry(db_url: str, conn: psycopg.Connection[Any]) -> None:
    for _ in range(3):
        rota(db_url, "enqueue", "report")
    conn.execute(
        "UPDATE rota.job SET status = 'dead', attempts = 5, last_error = 'ValueError: x'"
        " WHERE id <= 2"
    )
    listed = rota(db_url, "jobs", "list", "--status", "dead", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)] == [2, 1]
    table = rota(db_url, "dead", "list")
    assert "ValueError: x" in table.stdout and table.stdout.startswith("ID")
    shown = json.loads(rota(db_url, "jobs", "show", "3", "--json").stdout)
    assert (shown["status"], shown["type"]) == ("ready", "report")
    assert rota(db_url, "jobs", "show", "99").returncode == 2
    retried = rota(db_url, "dead", "retry", "1", "3")
    assert retried.returncode == 0
    assert (
        "1 job(s) back to ready" in retried.stdout
        and "not dead (left alone): [3]" in retried.stdout
    )
    assert rota(db_url, "dead", "retry", "--all").returncode == 0
    statuses = [r["status"] for r in conn.execute("SELECT status FROM rota.job ORDER BY id")]
    assert statuses == ["ready"] * 3


def test_commands_against_an_unreachable_database_exit_1(db_url: str) -> None:
    result = rota("postgresql://nobody@127.0.0.1:1/nothing", "enqueue", "t")
    assert result.returncode == 1
    assert "cannot reach the database of ROTA_DATABASE_URL" in result.stderr


def test_jobs_show_prints_the_traceback_as_lines_and_times_as_jobs_list(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    rota(db_url, "enqueue", "report", "--payload", '{"month": "2026-11"}')
    error = 'ValueError: bad month\n  File "app.py", line 3, in build\n    raise ValueError'
    conn.execute("UPDATE rota.job SET status = 'dead', last_error = %s WHERE id = 1", (error,))
    shown = rota(db_url, "jobs", "show", "1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[lines.index("last_error:") + 1 :] == [f"  {line}" for line in error.splitlines()]
    listed = rota(db_url, "jobs", "list").stdout.splitlines()
    run_at = listed[1].split()[5]  # the RUN_AT column of `jobs list`
    assert any(line.split() == ["run_at", run_at] for line in lines), (run_at, shown.stdout)
    assert any(line.split(None, 1) == ["payload", '{"month": "2026-11"}'] for line in lines)
