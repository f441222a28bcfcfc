"""Every `rota` command, given bad input, says so in one line and exits as DESIGN.md says.

Exit 2 for bad usage or input (unknown ids and names included), 1 for a runtime
error; exactly one line on stderr; never a traceback. The walk covers every
command the parser has: a new command needs its bad input here. The walk runs
`rota.cli.main` in-process (a traceback is an exception escaping it); what
only a real process shows (a handler module's import, the environment, a
closed pipe) runs `python -m rota`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota.cli import build_parser, main, reference

BAD_INPUT: dict[str, list[list[str]]] = {
    "migrate": [["--grant", ","], ["--key-index", "full"]],
    "enqueue": [["t", "--max-attempts", "0"], ["t", "--priority", "high"], ["t", "--delay", "-1"]],
    "pause": [[], ["t", "--all"]],
    "resume": [[]],
    "jobs list": [["--status", "sleeping"], ["--limit", "0"]],
    "jobs show": [["99999"], ["abc"]],
    "jobs cancel": [["99999"], [], ["--type", "t", "--status", "done"], ["1", "--type", "t"]],
    "dead list": [["--limit", "-1"]],
    "dead retry": [["99999"], [], ["1", "--all"]],
    "reaper": [["--interval", "soon"]],
    "scheduler": [["--every", "1"]],
    "archive": [["--older-than", "-1d"], ["--older-than=-1d"], ["--failed-older-than", "ages"]],
    "schedule add": [["s", "--type", "t", "--cron", "61 * * * *"], ["s", "--cron", "@daily"]],
    "schedule list": [["--all"]],
    "schedule remove": [["nosuch"]],
    "schedule suspend": [["nosuch"]],
    "schedule resume": [["nosuch"]],
    "schedule preview": [["--cron", "* * *"], ["--cron", "@daily", "--count", "0"]],
    "status": [["--max-age", "soon"], ["--watch", "0"]],
    "web": [["--port", "0"], ["--port", "http"]],
    "worker": [
        ["--concurrency", "-3"],
        ["--isolation", "fork"],
        ["--handlers", "broken_syntax"],
        ["--handlers", "broken_at_import"],
        ["--handlers", "no_such_module"],
    ],
    "demo": [["--seconds", "soon"], ["--port", "70000"]],
    "exporter": [["--port", "70000"], ["--cache", "-1"]],
    "limit set": [["t", "--concurrency", "0"], ["t", "--rate", "5"], []],
    "limit clear": [[]],
    "limit list": [["--json", "x"]],
}

HANDLER_MODULES = {
    "broken_syntax.py": "def send(:\n",
    "broken_at_import.py": "import os\nAPI_KEY = os.environ['MAILER_API_KEY_NOT_SET']\n",
}


def leaf_commands() -> list[str]:
    found = list(reference.commands(build_parser()))
    groups = {" ".join(words[1:-1]) for words, _, _ in found}
    return [" ".join(words[1:]) for words, _, _ in found if " ".join(words[1:]) not in groups]


def run(
    url: str | None, args: list[str], cwd: Path, **extra: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | extra
    env.pop("ROTA_DATABASE_URL", None)
    if url is not None:
        env["ROTA_DATABASE_URL"] = url
    env["PYTHONPATH"] = str(cwd)
    return subprocess.run(
        [sys.executable, "-m", "rota", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(code: int, stderr: str, expected: int) -> str:
    lines = stderr.splitlines()
    assert code == expected, (code, stderr)
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "unexpected" not in stderr, stderr
    assert lines[0].startswith("rota: "), lines
    return lines[0]


InProcess = Callable[[str, list[str]], tuple[int, str]]


@pytest.fixture
def in_process(
    handlers_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> InProcess:
    """`rota ARGS` against a database, in this process: (exit code, stderr)."""

    def run_main(url: str, args: list[str]) -> tuple[int, str]:
        monkeypatch.setenv("ROTA_DATABASE_URL", url)
        capsys.readouterr()
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:
            code = main(args)  # sets up logging for a command line: undone after
        finally:
            root.handlers[:], root.level = handlers, level
        return code, capsys.readouterr().err

    return run_main


@pytest.fixture(scope="module")
def walk_db(pg_server: Any, template_db: str) -> Iterator[str]:
    """One migrated database for the whole walk: bad input writes nothing."""
    name = f"rota_walk_{os.getpid()}"
    yield pg_server.create(name, template=template_db)
    pg_server.drop(name)


@pytest.fixture(scope="module")
def unmigrated_db(pg_server: Any) -> Iterator[str]:
    name = f"rota_unmigrated_{os.getpid()}"
    yield pg_server.create(name)
    pg_server.drop(name)


@pytest.fixture
def handlers_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in HANDLER_MODULES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROTA_LOG_FORMAT", raising=False)
    return tmp_path


def test_every_command_has_bad_input_in_this_walk() -> None:
    missing = sorted(set(leaf_commands()) - set(BAD_INPUT))
    assert not missing, f"add bad input for {missing} to BAD_INPUT"


@pytest.mark.parametrize(
    "args",
    [command.split() + bad for command, cases in BAD_INPUT.items() for bad in cases],
    ids=lambda args: " ".join(args),
)
def test_bad_input_is_one_line_and_exit_2(
    walk_db: str, in_process: InProcess, args: list[str]
) -> None:
    line = one_line(*in_process(walk_db, args), expected=2)
    assert line.startswith("rota: error: ")


def test_the_walk_wrote_nothing(walk_db: str) -> None:
    with psycopg.connect(walk_db) as conn:
        assert conn.execute("SELECT count(*) FROM rota.job").fetchone() == (0,)
        names = [r[0] for r in conn.execute("SELECT name FROM rota.schedule")]
    assert names == ["rota/archive"]


def test_a_handler_module_that_fails_to_import_is_named_with_its_error(
    handlers_dir: Path,
) -> None:
    syntax = run(None, ["worker", "--handlers", "broken_syntax"], handlers_dir)
    line = one_line(syntax.returncode, syntax.stderr, expected=2)
    assert "'broken_syntax': SyntaxError: invalid syntax" in line
    raised = run(None, ["worker", "--handlers", "broken_at_import"], handlers_dir)
    line = one_line(raised.returncode, raised.stderr, expected=2)
    assert "'broken_at_import': KeyError: 'MAILER_API_KEY_NOT_SET'" in line


def test_choices_are_plain_values_and_range_errors_name_the_option(
    walk_db: str, in_process: InProcess
) -> None:
    _, choice = in_process(walk_db, ["jobs", "cancel", "--type", "t", "--status", "done"])
    assert "Status" not in choice and "ready" in choice and "running" in choice
    _, ranged = in_process(walk_db, ["worker", "--concurrency", "-3"])
    assert "argument --concurrency: must be at least 1" in ranged
    _, dashed = in_process(walk_db, ["archive", "--older-than", "-1d"])
    assert "--older-than=-1d" in dashed


NEEDS_THE_SCHEMA = [
    ["enqueue", "t"],
    ["pause", "t"],
    ["resume", "--all"],
    ["jobs", "list"],
    ["jobs", "show", "1"],
    ["jobs", "cancel", "1"],
    ["dead", "list"],
    ["dead", "retry", "--all"],
    ["archive"],
    ["reaper", "--once"],
    ["scheduler", "--once"],
    ["schedule", "add", "s", "--type", "t", "--cron", "@daily"],
    ["schedule", "list"],
    ["schedule", "remove", "s"],
    ["status"],
]


@pytest.mark.parametrize("args", NEEDS_THE_SCHEMA, ids=" ".join)
def test_before_migrate_every_command_says_run_rota_migrate(
    unmigrated_db: str, in_process: InProcess, args: list[str]
) -> None:
    line = one_line(*in_process(unmigrated_db, args), expected=1)
    assert "rota migrate" in line


def test_an_invalid_database_url_is_bad_input(tmp_path: Path) -> None:
    result = run("not a url", ["jobs", "list"], tmp_path)
    line = one_line(result.returncode, result.stderr, expected=2)
    assert "ROTA_DATABASE_URL is not a valid PostgreSQL URL: " in line


def test_no_database_url_and_no_server_names_the_variable(tmp_path: Path) -> None:
    result = run(None, ["jobs", "list"], tmp_path, PGHOST=str(tmp_path / "no-server-here"))
    line = one_line(result.returncode, result.stderr, expected=1)
    assert "ROTA_DATABASE_URL is not set" in line


def test_a_closed_pipe_ends_quietly(walk_db: str, pg_server: Any, template_db: str) -> None:
    name = f"rota_pipe_{os.getpid()}"
    url = pg_server.create(name, template=template_db)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO rota.job (type) SELECT 't' FROM generate_series(1, 2000)")
        reader = subprocess.Popen(
            [sys.executable, "-m", "rota", "jobs", "list", "--limit", "2000", "--json"],
            env=dict(os.environ, ROTA_DATABASE_URL=url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert reader.stdout is not None and reader.stderr is not None
        assert reader.stdout.read(60)  # more than a pipe holds is on its way
        reader.stdout.close()  # the reader goes away, as `| head -c 60` does
        err = reader.stderr.read()
        assert reader.wait(timeout=60) == 0
        assert err == b""
    finally:
        pg_server.drop(name)


@pytest.mark.parametrize(
    ("stdout", "code", "said"),
    [
        # Closed (`rota jobs list >&-`): Python has no sys.stdout, print writes nothing.
        ("closed", 0, ""),
        # Full: the output cannot be written; said in one line.
        ("/dev/full", 1, "No space left on device"),
    ],
)
def test_an_output_that_cannot_be_written_is_said_in_one_line(
    walk_db: str, stdout: str, code: int, said: str
) -> None:
    redirect = ">&-" if stdout == "closed" else f"> {stdout}"
    done = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m rota jobs list {redirect}'],
        env=dict(os.environ, ROTA_DATABASE_URL=walk_db),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, done.stderr
    assert said in done.stderr and len(done.stderr.splitlines()) == len(said and [said])
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["enqueue", "t", "--priority", "10"], "--priority"),
        (["enqueue", "t", "--timeout", "0"], "--timeout"),
        (["schedule", "add", "s", "--type", "t", "--cron", "@daily", "--spread-seconds", "-1"],
         "--spread-seconds"),
        (["reaper", "--interval", "0"], "--interval"),
        (["worker", "--lease", "0"], "--lease"),
        (["worker", "--metrics-port", "99999"], "--metrics-port"),
        (["exporter", "--port", "70000"], "--port"),
        (["worker", "--statement-timeout", "-1"], "--statement-timeout"),
        (["worker", "--lock-timeout", "3000000"], "--lock-timeout"),
        (["worker", "--loop-stall", "0"], "--loop-stall"),
        (["worker", "--keepalives-count", "128"], "--keepalives-count"),
        (["reaper", "--answer-timeout", "0.5"], "--answer-timeout"),
        (["reaper", "--keepalives-idle", "32768"], "--keepalives-idle"),
        (["scheduler", "--connect-timeout", "1"], "--connect-timeout"),
        (["scheduler", "--tcp-user-timeout", "nan"], "--tcp-user-timeout"),
        (["archive", "--keepalives-interval", "1.5"], "--keepalives-interval"),
    ],
)  # fmt: skip
def test_range_errors_name_their_option(
    walk_db: str, in_process: InProcess, args: list[str], option: str
) -> None:
    line = one_line(*in_process(walk_db, args), expected=2)
    assert option in line, line


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        ("worker", "ROTA_STATEMENT_TIMEOUT_SECONDS", "-5"),
        ("worker", "ROTA_LOOP_STALL_SECONDS", "soon"),
        ("reaper", "ROTA_KEEPALIVES_IDLE_SECONDS", "40000"),
        ("scheduler", "ROTA_ANSWER_TIMEOUT_SECONDS", "0"),
        ("archive", "ROTA_KEEPALIVES_COUNT", "2.5"),
        ("reaper", "ROTA_PREPARED_STATEMENTS", "maybe"),
    ],
)
def test_a_bad_timeout_in_the_environment_names_its_variable(
    walk_db: str,
    in_process: InProcess,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    variable: str,
    value: str,
) -> None:
    monkeypatch.setenv(variable, value)
    line = one_line(*in_process(walk_db, [command]), expected=2)
    assert line.startswith(f"rota: error: {variable}: "), line
