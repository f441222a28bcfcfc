"""The timeouts of the long-running commands' own connections, and whether psycopg
prepares statements on them, given as options or environment variables
(`rota.cli.timeouts`): what is given reaches the connection the command opens
(asked back over it with SHOW, from libpq, and from psycopg), and a real
process's statements end at the statement timeout or the answer deadline it was
given. Bad values are one line and exit 2 (tests/acceptance/test_bad_input_walk.py)."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from rota.archive import Archiver
from rota.cli import main
from rota.reaper import Reaper
from rota.scheduler import Scheduler
from rota_worker.worker import Worker
from tests.acceptance.procs import WorkerProcess, env_for, wait_for

OPTIONS = [
    "--connect-timeout", "3",
    "--keepalives-idle", "11",
    "--keepalives-interval", "4",
    "--keepalives-count", "6",
    "--tcp-user-timeout", "9.5",
    "--statement-timeout", "7",
    "--answer-timeout", "12",
    "--no-prepared-statements",
]  # fmt: skip

ENVIRONMENT = {
    "ROTA_CONNECT_TIMEOUT_SECONDS": "3",
    "ROTA_KEEPALIVES_IDLE_SECONDS": "11",
    "ROTA_KEEPALIVES_INTERVAL_SECONDS": "4",
    "ROTA_KEEPALIVES_COUNT": "6",
    "ROTA_TCP_USER_TIMEOUT_SECONDS": "9.5",
    "ROTA_STATEMENT_TIMEOUT_SECONDS": "7",
    "ROTA_ANSWER_TIMEOUT_SECONDS": "12",
    "ROTA_PREPARED_STATEMENTS": "off",
}

GIVEN = {
    "statement_timeout": "7s",
    "lock_timeout": "0",
    "connect_timeout": "3",
    "keepalives": "1",
    "keepalives_idle": "11",
    "keepalives_interval": "4",
    "keepalives_count": "6",
    "tcp_user_timeout": "9500",
    "prepare_threshold": None,
}


def observed(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """The timeouts a connection carries: the server's settings asked over it, and
    libpq's connection parameters; and when psycopg prepares its statements."""
    params = conninfo_to_dict(conn.info.dsn)
    seen: dict[str, Any] = {key: params.get(key) for key in GIVEN if key in params}
    seen["prepare_threshold"] = conn.prepare_threshold
    for setting in ("statement_timeout", "lock_timeout"):
        seen[setting] = conn.execute(f"SHOW {setting}").fetchone()[setting]  # type: ignore[index]
    return seen


@pytest.fixture
def rota_main(monkeypatch: pytest.MonkeyPatch) -> Callable[..., int]:
    """`rota ARGS` in this process with ROTA_DATABASE_URL (and `env`) set."""

    def run(db_url: str, *args: str, env: dict[str, str] | None = None) -> int:
        monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:
            return main(list(args))
        finally:
            root.handlers[:], root.level = handlers, level

    return run


def _watching(monkeypatch: pytest.MonkeyPatch, service: type, seen: list[dict[str, Any]]) -> None:
    """Make `service`'s passes note what their connection carries first."""
    real = service.run_once

    def run_once(self: Any, conn: psycopg.Connection[Any], now: Any = None) -> Any:
        seen.append({**observed(conn), "answer": conn.deadlines.answer_seconds})  # type: ignore[attr-defined]
        return real(self, conn, now)

    monkeypatch.setattr(service, "run_once", run_once)


@pytest.mark.parametrize(
    ("command", "service"),
    [(["reaper", "--once"], Reaper), (["scheduler", "--once"], Scheduler), (["archive"], Archiver)],
    ids=["reaper", "scheduler", "archive"],
)
def test_the_options_reach_the_connection_of_each_service(
    db_url: str,
    rota_main: Callable[..., int],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    service: type,
) -> None:
    seen: list[dict[str, Any]] = []
    _watching(monkeypatch, service, seen)
    assert rota_main(db_url, *command, *OPTIONS) == 0
    assert seen[0] == {**GIVEN, "answer": 12}


def test_the_environment_gives_what_no_option_gives(
    db_url: str, rota_main: Callable[..., int], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    _watching(monkeypatch, Reaper, seen)
    assert rota_main(db_url, "reaper", "--once", env=ENVIRONMENT) == 0
    assert seen[-1] == {**GIVEN, "answer": 12}
    # An option wins over its variable; 0 sends no statement timeout at all.
    assert rota_main(db_url, "reaper", "--once", "--statement-timeout", "0", env=ENVIRONMENT) == 0
    assert seen[-1] == {**GIVEN, "statement_timeout": "0", "answer": 12}
    # Prepared statements are on unless turned off (psycopg's sixth run prepares).
    assert rota_main(db_url, "reaper", "--once", env={"ROTA_PREPARED_STATEMENTS": "on"}) == 0
    assert seen[-1]["prepare_threshold"] == 5


def test_the_options_reach_the_connections_of_a_worker(
    db_url: str, rota_main: Callable[..., int], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def run(self: Worker, install_signals: bool = True) -> None:
        # The connections the worker's loops open (rota_worker.link, .leases).
        for name, lock_timeout in (("claim", False), ("heartbeat", True)):
            conn = self.deadlines.connect(
                self.dsn, f"rota-worker-{name}", lock_timeout=lock_timeout
            )
            with contextlib.closing(conn):
                seen[name] = observed(conn)
        seen["answer"] = self.deadlines.answer_seconds
        seen["loop_stall"] = self.stalls.stall_seconds

    monkeypatch.setattr(Worker, "run", run)
    args = [*OPTIONS, "--lock-timeout", "0.25", "--loop-stall", "0.5"]
    assert rota_main(db_url, "worker", *args) == 0
    assert seen == {
        "claim": GIVEN,
        "heartbeat": {**GIVEN, "lock_timeout": "250ms"},
        "answer": 12,
        "loop_stall": 0.5,
    }


@contextlib.contextmanager
def _locked(db_url: str, table: str) -> Iterator[None]:
    """`table` locked against every reader until the block ends."""
    with psycopg.connect(db_url) as holder:
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
        holder.rollback()


def test_a_real_worker_s_statements_end_at_the_statement_timeout_of_its_environment(
    db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with _locked(db_url, "rota.worker"):
        worker = WorkerProcess(
            db_url,
            "--no-scheduler",
            "--no-reaper",
            log=log,
            env={"ROTA_STATEMENT_TIMEOUT_SECONDS": "1"},
        )
        try:
            wait_for(lambda: "statement timeout" in log.read_text(), 30, "its registration to end")
        finally:
            worker.stop()
    assert "cannot update rota.worker (QueryCanceled" in log.read_text()


def test_a_real_reaper_takes_its_connection_for_dead_at_its_answer_timeout(
    db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "reaper.log"
    args = ["--statement-timeout", "0", "--answer-timeout", "1", "--interval", "0.2"]
    with _locked(db_url, "rota.job"), open(log, "w") as out:
        reaper = subprocess.Popen(
            [sys.executable, "-m", "rota", "reaper", *args],
            env=env_for(db_url),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: "no answer" in log.read_text(), 30, "the deadline to end its pass")
        finally:
            reaper.terminate()
            reaper.wait(timeout=30)
    assert "no answer on a connection (rota-reaper) for 1s" in log.read_text()
