"""Random and malformed arguments to every `rota` subcommand, run in-process on a real database.

Whatever the arguments: no traceback, exit code 0, 1 or 2, and a failure is
one line on stderr. Exit 2 (bad usage or input) also means nothing was written:
every table of schema rota reads the same before and after. The long-running
commands are driven with `--once` (reaper, scheduler); `rota worker`, `rota
demo` and `rota status --watch` only with arguments they must refuse.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota.cli import main

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=int(os.environ.get("ROTA_PROPERTY_EXAMPLES") or 60),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

COMMANDS = [
    ["migrate"],
    ["enqueue"],
    ["jobs", "list"],
    ["jobs", "show"],
    ["jobs"],
    ["dead", "list"],
    ["dead", "retry"],
    ["schedule", "add"],
    ["schedule", "list"],
    ["schedule", "remove"],
    ["schedule", "suspend"],
    ["schedule", "resume"],
    ["schedule", "preview"],
    ["schedule"],
    ["archive"],
    ["status"],
    ["reaper", "--once"],
    ["scheduler", "--once"],
    ["no-such-command"],
    [],
]
OPTIONS = [
    "--payload", "--key", "--run-at", "--delay", "--max-attempts", "--max-payload-bytes",
    "--status", "--type", "--limit", "--json", "--all", "--cron", "--timezone", "--from",
    "--count", "--spread-seconds", "--concurrency-policy", "--starting-deadline-seconds",
    "--suspend", "--older-than", "--failed-older-than", "--max-age", "--max-lease-expirations",
    "--grant", "--interval", "--bogus", "-v", "--log-format", "--", "-",
]  # fmt: skip
ODD_VALUES = [
    "", " ", "-1", "0", "1", "42", "1e999", "-1e999", "nan", "inf", "1.5", "0x10",
    "99999999999999999999", "{", "[]", "{}", '{"a": 1}', "null", '"x"', "* * * * *",
    "61 * * * *", "0 9-9 * * *", "@daily", "@reboot", "0 0 31 2 *", "UTC", "Europe/Berlin",
    "Mars/Olympus", "../etc/passwd", "2026-13-01", "2026-03-29T02:30", "2026-03-29T02:30Z",
    "9999-12-31T23:59:59+14:00", "7d", "-5m", "15x", "Allow", "Forbid", "ready", "dead",
    "t", "a,b", "\u00e9\u00e8", "\U0001f642", "a\nb", "x" * 300, "\x00", "a\x00b", "text", "json",
]  # fmt: skip
SCHEDULE_OPTIONS = [
    "--payload", "--max-attempts", "--spread-seconds", "--concurrency-policy",
    "--starting-deadline-seconds", "--suspend",
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(ODD_VALUES),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(max_size=12),
)
TOKENS = st.one_of(st.sampled_from(OPTIONS), VALUES)


def snapshot(db_url: str) -> dict[str, Any]:
    """Every table of schema rota, as a digest of its rows."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'rota' ORDER BY 1"
            )
        ]
        return {
            t: conn.execute(
                f"SELECT count(*), md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), ''))"
                f" FROM rota.{t} x"
            ).fetchone()
            for t in tables
        }


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # --help, and only --help, exits through argparse
        assert exc.code == 0 and any(a in ("-h", "--help") for a in argv), argv
        code = 0
    return code, capsys.readouterr().err


def check(argv: list[str], db_url: str, capsys: pytest.CaptureFixture[str]) -> int:
    before = snapshot(db_url)
    code, err = run(argv, capsys)
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err and "rota: unexpected" not in err, (argv, err)
    if code:
        lines = [line for line in err.splitlines() if not line.startswith(("INFO", "DEBUG"))]
        assert len(lines) == 1 and lines[0].startswith("rota: "), (argv, err)
    if code == 2:
        assert err.startswith("rota: error: "), (argv, err)
        assert snapshot(db_url) == before, (argv, err)
    return code


@pytest.fixture
def cli_db(db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    monkeypatch.delenv("ROTA_LOG_FORMAT", raising=False)
    return db_url


@FUZZ
@given(st.sampled_from(COMMANDS), st.lists(TOKENS, max_size=6))
def test_random_arguments_never_crash_and_bad_ones_write_nothing(
    cli_db: str, capsys: pytest.CaptureFixture[str], command: list[str], tokens: list[str]
) -> None:
    check([*command, *tokens], cli_db, capsys)


@FUZZ
@given(
    st.sampled_from(["name", "", " ", "a/b", "x" * 300, "\x00"]),
    st.sampled_from(["t", "", " ", "\x00"]),
    VALUES,
    VALUES,
    st.lists(st.sampled_from(SCHEDULE_OPTIONS), max_size=2),
    st.lists(VALUES, max_size=2),
)
def test_schedule_add_accepts_only_what_it_can_store(
    cli_db: str,
    capsys: pytest.CaptureFixture[str],
    name: str,
    job_type: str,
    cron: str,
    timezone: str,
    options: list[str],
    values: list[str],
) -> None:
    argv = ["schedule", "add", name, "--type", job_type, "--cron", cron, "--timezone", timezone]
    argv += [x for pair in zip(options, values, strict=False) for x in pair]
    check(argv, cli_db, capsys)


@FUZZ
@given(
    st.sampled_from(["t", "", "\x00", "x" * 300]),
    st.lists(st.sampled_from(["--payload", "--key", "--run-at", "--delay", "--max-attempts"])),
    st.lists(VALUES, max_size=5),
)
def test_enqueue_accepts_only_what_it_can_store(
    cli_db: str,
    capsys: pytest.CaptureFixture[str],
    job_type: str,
    options: list[str],
    values: list[str],
) -> None:
    argv = ["enqueue", job_type, *(x for p in zip(options, values, strict=False) for x in p)]
    check(argv, cli_db, capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--concurrency", "0"],
        ["worker", "--concurrency", "many"],
        ["worker", "--lease", "-1"],
        ["worker", "--lease", "soon"],
        ["worker", "--poll-interval", "0"],
        ["worker", "--grace-period", "-3"],
        ["worker", "--metrics-port", "http"],
        ["worker", "--handlers", "no_such_module_anywhere"],
        ["worker", "--bogus"],
        ["reaper", "--interval", "0"],
        ["reaper", "--interval", "nan"],  # ran for ever
        ["reaper", "--interval", "inf"],
        ["worker", "--lease", "nan"],  # started a worker
        ["worker", "--poll-interval", "inf"],
        ["worker", "--grace-period", "nan"],
        ["worker", "--statement-timeout", "inf"],
        ["worker", "--answer-timeout", "nan"],
        ["worker", "--loop-stall", "inf"],
        ["reaper", "--tcp-user-timeout", "-1"],
        ["scheduler", "--keepalives-count", "0"],
        ["status", "--watch", "0"],
        ["status", "--watch", "-1s"],
        ["status", "--max-age", "old"],
        ["status", "--watch", "nan"],  # a traceback from time.sleep
        ["status", "--watch", "inf"],
        ["archive", "--older-than", "nan"],
        ["archive", "--delete-archived-older-than", "nan"],
        ["demo", "--seconds", "x"],
    ],
)
def test_long_running_commands_refuse_bad_arguments_before_starting(
    cli_db: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert check(argv, cli_db, capsys) == 2
