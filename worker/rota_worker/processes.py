"""Sync handlers in child processes (``--isolation process``): killable, at a cost.

Each child runs one attempt at a time and lives on between attempts; it imports
the handler modules itself when it starts (spawn, not fork: a forked copy of a
threaded asyncio process is not safe). When an attempt is stopped, its outcome
is decided at once and its slot freed, and its child is condemned: it gets
SIGUSR1 (the handler sees ``job.cancelled`` set), SIGTERM after the grace
period and SIGKILL two seconds later, and a fresh child takes its place. A
condemned child that returns in time is kept. Costs: a start-up of a Python
interpreter per child (and per replacement), payloads and outcomes pickled
over a pipe, and memory for `concurrency` interpreters.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Sequence

from rota.claim import Attempt
from rota.handlers import Context, Handler, registered
from rota.jobs import Job
from rota.settings import BackoffSettings
from rota_worker.execute import Decided, outcome_of_error

log = logging.getLogger("rota.worker")

KILL_AFTER_TERM_SECONDS = 2.0
"""After SIGTERM, how long a child may take to exit before SIGKILL."""


def _child_main(
    conn: multiprocessing.connection.Connection,
    modules: Sequence[str],
    dsn: str,
    worker_id: str,
    backoff: BackoffSettings,
) -> None:
    """A child's life: import the handlers, then run one attempt per message."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    for name in ["rota.archive", *modules]:
        importlib.import_module(name)
    handlers = registered()
    context = Context(dsn, worker_id)
    current: list[Job] = []

    def stop_current(*_: object) -> None:
        for running in current:
            running.cancelled.set()

    signal.signal(signal.SIGUSR1, stop_current)
    while True:
        try:
            row = conn.recv()
        except EOFError:
            return
        job = Job(**row)
        current[:] = [job]
        handler = handlers[job.type]
        args = (job, context) if handler.wants_context else (job,)
        try:
            handler.func(*args)
            reply: Attempt | None = None
        except BaseException as exc:
            reply = outcome_of_error(job, exc, backoff)
        current.clear()
        conn.send(reply)


class Child:
    def __init__(self, runner: ProcessRunner) -> None:
        parent, child = multiprocessing.get_context("spawn").Pipe()
        self.conn = parent
        self.process = multiprocessing.get_context("spawn").Process(
            target=_child_main,
            args=(child, runner.modules, runner.dsn, runner.worker_id, runner.backoff),
            name="rota-job-process",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.condemned = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    async def run(self, job: Job) -> Attempt | None:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Attempt | None] = loop.create_future()

        def readable() -> None:
            loop.remove_reader(self.conn.fileno())
            try:
                reply.set_result(self.conn.recv())
            except (EOFError, OSError) as exc:
                reply.set_exception(RuntimeError(f"handler process {self.pid} died: {exc}"))

        self.conn.send(job.to_row())
        loop.add_reader(self.conn.fileno(), readable)
        try:
            return await reply
        except asyncio.CancelledError:
            # From here on the reaper reads what the child still sends.
            loop.remove_reader(self.conn.fileno())
            raise

    def signal(self, signum: int) -> None:
        if self.process.is_alive() and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        self.signal(signal.SIGKILL)
        self.process.join(timeout=1)


class ProcessRunner:
    """At most `concurrency` live children, and any number of condemned ones."""

    def __init__(
        self,
        concurrency: int,
        modules: Sequence[str],
        dsn: str,
        worker_id: str,
        backoff: BackoffSettings,
        kill_grace_seconds: float,
    ) -> None:
        self.concurrency = concurrency
        self.modules = list(modules)
        self.dsn = dsn
        self.worker_id = worker_id
        self.backoff = backoff
        self.kill_grace_seconds = kill_grace_seconds
        self._idle: list[Child] = []
        self._live = 0
        self._freed = asyncio.Condition()
        self.killed = 0
        """Children killed because they outlived their attempt's stop."""

    healthy = True
    abandoned = 0

    async def _acquire(self) -> Child:
        async with self._freed:
            await self._freed.wait_for(lambda: bool(self._idle) or self._live < self.concurrency)
            if self._idle:
                return self._idle.pop()
            self._live += 1
        return Child(self)

    async def _give_back(self, child: Child) -> None:
        async with self._freed:
            self._idle.append(child)
            self._freed.notify()

    async def __call__(self, handler: Handler, job: Job, context: Context) -> None:
        child = await self._acquire()
        try:
            decided = await child.run(job)
        except asyncio.CancelledError:
            await self._condemn(child)
            raise
        except RuntimeError:
            await self._lose_slot()
            child.close()
            raise
        await self._give_back(child)
        if decided is not None:
            raise Decided(decided)

    async def _condemn(self, child: Child) -> None:
        """Stop waiting for `child`; its slot goes to a fresh one; kill it unless it
        returns within the grace period."""
        await self._lose_slot()
        child.signal(signal.SIGUSR1)
        asyncio.get_running_loop().create_task(self._reap(child))

    async def _lose_slot(self) -> None:
        async with self._freed:
            self._live -= 1
            self._freed.notify()

    async def _reap(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        returned = await loop.run_in_executor(None, child.conn.poll, self.kill_grace_seconds)
        if returned:
            with contextlib.suppress(EOFError, OSError):
                child.conn.recv()
            async with self._freed:
                if self._live < self.concurrency:
                    self._live += 1
                    self._idle.append(child)
                    self._freed.notify()
                    return
        log.warning("handler process %s outlived its attempt; killing it", child.pid)
        self.killed += 1
        child.signal(signal.SIGTERM)
        await loop.run_in_executor(None, child.process.join, KILL_AFTER_TERM_SECONDS)
        child.close()

    def pids(self) -> list[int]:
        return [c.pid for c in self._idle if c.pid is not None]

    def close(self) -> None:
        for child in self._idle:
            child.close()
        self._idle.clear()
