"""Running `rota` as users do: subprocesses with ROTA_DATABASE_URL set."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def env_for(db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, ROTA_DATABASE_URL=db_url, PYTHONPATH=str(HERE), **extra)
    env.pop("PGHOST", None)
    return env


def rota(db_url: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rota", *args],
        env=env_for(db_url, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


STARTED = " started: types="
"""What a worker logs once it stops on SIGTERM by finishing its jobs."""


class WorkerProcess:
    started: list[WorkerProcess] = []
    """Every worker a test started: `kill_leftovers` ends those still running."""

    def __init__(
        self,
        db_url: str,
        *args: str,
        prelude: str = "",
        log: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        code = f"{prelude}\nfrom rota.cli import run\nrun()"
        argv = [sys.executable, "-c", code, "worker", "--handlers", "app_handlers", *args]
        self.log_path = log
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, env=env_for(db_url, **(env or {})), stdout=out, stderr=subprocess.STDOUT
        )
        WorkerProcess.started.append(self)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path else ""

    def stop(self) -> int:
        """SIGTERM once the worker can take it, and its exit code. A worker still
        importing its handlers (a loaded machine, a test whose jobs the other
        workers finished) has not yet set its handler: SIGTERM would kill it."""
        if self.log_path is not None:
            deadline = time.monotonic() + 60
            while (
                self.proc.poll() is None
                and STARTED not in self.output()
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        try:
            return self.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int, path: str) -> int | None:
    """The HTTP status a worker's probe answers (None when nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def kill_leftovers() -> None:
    """Kill every worker a test left running (a failed test must not leak processes)."""
    while WorkerProcess.started:
        worker = WorkerProcess.started.pop()
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGCONT)
            worker.proc.kill()
            worker.proc.wait(timeout=30)


def wait_for(condition: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
