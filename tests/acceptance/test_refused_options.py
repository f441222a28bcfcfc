"""A connection option libpq refuses stops every long-running command at its start.

`rota worker`, `rota scheduler`, `rota reaper`, `rota exporter` and `rota web`
wait for a database that is away (nothing listening, a server restarting, a
host not resolvable), but an option libpq refuses before it asks any server
(`sslmode=bogus`, `connect_timeout=abc`) can never succeed by waiting: it is
bad input, exit 2 with one line on stderr that names where the option came
from, ROTA_DATABASE_URL or a PG* variable. Real processes, each given a
deadline: a command that waits instead of exiting fails the test.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.acceptance.procs import env_for, free_port, probe, wait_for

DEADLINE = 30.0
"""Seconds a command may take to exit on a refused option: its start, not a wait."""

COMMANDS = ["worker", "scheduler", "reaper", "exporter", "web"]

REFUSED = [
    ("sslmode", "bogus", 'invalid sslmode value: "bogus"'),
    ("connect_timeout", "abc", "bad value for connect_timeout: 'abc'"),
    ("target_session_attrs", "x", 'invalid target_session_attrs value: "x"'),
    ("keepalives", "x", 'invalid integer value "x" for connection option "keepalives"'),
]
"""Options libpq (or psycopg before it) refuses, and what it says of each."""


def argv(command: str, port: int) -> list[str]:
    """`rota COMMAND` as the command line runs it; `port` for what serves HTTP."""
    extra = {
        "worker": ["--handlers", "app_handlers"],
        "exporter": ["--port", str(port)],
        "web": ["--port", str(port)],
    }
    return [sys.executable, "-m", "rota", command, *extra.get(command, [])]


def without_pg(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if not name.startswith("PG")}


def refused_line(command: str, env: dict[str, str]) -> str:
    """The one line `command` says on stderr as it exits 2, within the deadline."""
    try:
        done = subprocess.run(
            argv(command, free_port()), env=env, capture_output=True, text=True, timeout=DEADLINE
        )
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr
        raise AssertionError(f"rota {command} still ran after {DEADLINE}s: {said!r}") from None
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.mark.parametrize(("option", "value", "said"), REFUSED, ids=[r[0] for r in REFUSED])
@pytest.mark.parametrize("command", COMMANDS)
def test_an_option_of_the_url_libpq_refuses_exits_2_at_once(
    db_url: str, command: str, option: str, value: str, said: str
) -> None:
    url = make_conninfo(db_url, **{option: value})
    line = refused_line(command, without_pg(env_for(url)))
    assert line == f"rota: error: ROTA_DATABASE_URL has a connection option libpq refuses: {said}"


def _pg_variables(db_url: str) -> dict[str, str]:
    """The test database as libpq's PG* variables, ROTA_DATABASE_URL unset."""
    parts = conninfo_to_dict(db_url)
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE"}
    env = without_pg(env_for(db_url))
    del env["ROTA_DATABASE_URL"]
    return env | {names[key]: str(parts[key]) for key in names if parts.get(key)}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_pg_variable_libpq_refuses_is_named(db_url: str, command: str) -> None:
    env = _pg_variables(db_url) | {"PGSSLMODE": "bogus"}
    line = refused_line(command, env)
    assert line == (
        "rota: error: PGSSLMODE has a connection option libpq refuses:"
        ' invalid sslmode value: "bogus"'
    )


@pytest.mark.parametrize("command", ["worker", "scheduler"])
def test_a_pg_variable_beside_the_url_is_named_not_the_url(db_url: str, command: str) -> None:
    # The chart sets PGSSLMODE beside ROTA_DATABASE_URL (database.tls.sslmode).
    env = without_pg(env_for(db_url)) | {"PGSSLMODE": "verify-fulll"}
    assert refused_line(command, env) == (
        "rota: error: PGSSLMODE has a connection option libpq refuses:"
        ' invalid sslmode value: "verify-fulll"'
    )
    no_port = {key: value for key, value in conninfo_to_dict(db_url).items() if key != "port"}
    env = without_pg(env_for(make_conninfo("", **no_port))) | {"PGPORT": "99999"}
    assert refused_line(command, env) == (
        'rota: error: PGPORT has a connection option libpq refuses: invalid port number: "99999"'
    )


@pytest.fixture
def nothing_listening(db_url: str) -> str:
    """The test database's URL on a port where nothing listens: an outage."""
    return make_conninfo(db_url, port=str(free_port()))


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts: stopped (and waited for) when it ends."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_outage_is_still_waited_for(
    nothing_listening: str, tmp_path: Path, started: list[subprocess.Popen[bytes]], command: str
) -> None:
    log = tmp_path / f"{command}.log"
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv(command, port),
            env=without_pg(env_for(nothing_listening)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    started.append(proc)
    wait_for(
        lambda: "waiting for the database" in log.read_text() or proc.poll() is not None,
        60,
        f"rota {command} to wait for the database",
    )
    assert proc.poll() is None, log.read_text()
    assert "Connection refused" in log.read_text()
    if command in ("exporter", "web"):  # they serve meanwhile, as ever
        assert wait_for(lambda: probe(port, "/healthz") == 200, 60, f"rota {command}'s /healthz")
    assert proc.poll() is None, log.read_text()
