"""Processes that fault tests start, and stop for certain, pass or fail.

`Fleet` starts `rota` commands as users run them (subprocesses with
ROTA_DATABASE_URL, handlers from this directory) and remembers every one:
`stop_all()`, called from a fixture's teardown, resumes stopped ones, asks each
to stop, and kills what does not stop in time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log_path = log
        self.killed = False
        self.terminated = False
        with open(log, "w") as out:
            self.popen = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def locked_by_pattern(self) -> str:
        """A LIKE pattern matching this worker's id (host:pid:random) in locked_by."""
        return f"%:{self.pid}:%"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def kill(self) -> None:
        self.killed = True
        self.send(signal.SIGKILL)
        self.popen.wait(60)

    def terminate(self) -> None:
        """SIGTERM, after SIGCONT in case it was stopped; once only (a second SIGTERM
        during the interpreter's shutdown would find Python's handler gone)."""
        if self.alive() and not self.terminated:
            self.terminated = True
            self.send(signal.SIGCONT)
            self.send(signal.SIGTERM)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then SIGKILL if it has not ended after `timeout`."""
        self.terminate()
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.wait(60)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Fleet:
    def __init__(self, db_url: str, logs: Path, **env: str) -> None:
        self.db_url = db_url
        self.logs = logs
        self.env = dict(os.environ, ROTA_DATABASE_URL=db_url, PYTHONPATH=str(HERE), **env)
        self.env.pop("PGHOST", None)
        self.procs: list[Proc] = []

    def start(self, name: str, *args: str) -> Proc:
        argv = [sys.executable, "-m", "rota", *args]
        proc = Proc(name, argv, self.env, self.logs / f"{name}-{len(self.procs)}.log")
        self.procs.append(proc)
        return proc

    def worker(self, *args: str) -> Proc:
        return self.start("worker", "worker", "--handlers", "soak_handlers", *args)

    def alive(self, name: str) -> list[Proc]:
        return [p for p in self.procs if p.name == name and p.alive()]

    def stop_all(self, timeout: float = 60) -> dict[Proc, int]:
        """Stop every process still running; returns their exit codes."""
        running = [p for p in self.procs if p.alive()]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + timeout
        codes = {}
        for proc in running:
            codes[proc] = proc.stop(max(0.1, deadline - time.monotonic()))
        return codes
