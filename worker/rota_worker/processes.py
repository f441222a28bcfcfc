"""Sync handlers in child processes (``--isolation process``): killable, at a cost.

Each child runs one attempt at a time and lives on between attempts; it imports
the handler modules itself when it starts (spawn, not fork: a forked copy of a
threaded asyncio process is not safe). When an attempt is stopped, its child is
condemned: it gets SIGUSR1 (the handler sees ``job.cancelled`` set), SIGTERM
after the grace period and SIGKILL two seconds later. A child ignores SIGINT
and SIGTERM until it is condemned: a signal to the whole process group
reaches it, and the parent's shutdown decides. The attempt ends, and
its slot is free for a fresh child, only once the condemned one returned or is
dead: two children never run in one slot. A condemned child that returns in
time is kept. Costs: a start-up of a Python
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
from collections.abc import Callable, Sequence
from typing import Any

from rota import limits
from rota.claim import Attempt
from rota.durable import RunConnections
from rota.handlers import Context, Handler, call, registered
from rota.jobs import Job, Outcome
from rota.settings import BackoffSettings, ConnectionSettings
from rota_worker.execute import Decided, outcome_of_error

log = logging.getLogger("rota.worker")

KILL_AFTER_TERM_SECONDS = 2.0
"""After SIGTERM, how long a child may take to exit before SIGKILL."""


READY = "ready"
"""A child's first message: its handlers are imported, it takes jobs."""


def _child_main(
    conn: multiprocessing.connection.Connection,
    modules: Sequence[str],
    dsn: str,
    worker_id: str,
    backoff: BackoffSettings,
    connection: ConnectionSettings,
) -> None:
    """A child's life: import the handlers, then run one attempt per message."""
    current: list[Job] = []

    def stop_current(*_: object) -> None:
        # Condemned: the parent's SIGTERM after the kill grace ends this process
        # (or reaches the handler's own, if it set one).
        if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for running in current:
            running.cancelled.set()

    signal.signal(signal.SIGUSR1, stop_current)
    # The parent decides when to stop: a SIGINT or SIGTERM sent to the whole
    # process group (a terminal, systemd, `timeout`) reaches it too, and its
    # shutdown gives a handler its grace period before it condemns the child.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for name in ["rota.archive", *modules]:
        importlib.import_module(name)
    handlers = registered()
    runs = RunConnections(dsn, 1, connection)
    context = Context(dsn, worker_id, connections=runs)
    conn.send(READY)
    while True:
        try:
            row = conn.recv()
        except EOFError:
            return
        job = Job(**row)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # kept after its last stop
        current[:] = [job]
        handler = handlers[job.type]
        try:
            value = call(handler, job, context)
            reply: Attempt | None = None
            if value is not None:
                result = limits.encode_result(value)
                reply = Attempt(job.id, job.attempts, Outcome.DONE, result=result)
        except BaseException as exc:
            reply = outcome_of_error(job, exc, backoff)
        current.clear()
        conn.send(reply)


class ChildDied(RuntimeError):
    """The child process running a handler is gone."""


class Child:
    def __init__(self, runner: ProcessRunner) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self.conn = parent
        self.process = context.Process(
            target=_child_main,
            args=(
                child,
                runner.modules,
                runner.dsn,
                runner.worker_id,
                runner.backoff,
                runner.connection,
            ),
            name="rota-job-process",
            daemon=True,
        )
        self.process.start()
        child.close()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    async def receive(self) -> Any:
        """The child's next message (ChildDied when it has none to give)."""
        loop = asyncio.get_running_loop()
        message: asyncio.Future[Any] = loop.create_future()

        def readable() -> None:
            loop.remove_reader(self.conn.fileno())
            try:
                message.set_result(self.conn.recv())
            except (EOFError, OSError) as exc:
                message.set_exception(ChildDied(f"handler process {self.pid} died: {exc!r}"))

        loop.add_reader(self.conn.fileno(), readable)
        try:
            return await message
        except asyncio.CancelledError:
            loop.remove_reader(self.conn.fileno())
            raise

    async def start(self) -> None:
        if await self.receive() != READY:  # pragma: no cover - a protocol slip
            raise ChildDied(f"handler process {self.pid} did not start")

    async def run(self, job: Job, started: Callable[[], None]) -> Attempt | None:
        try:
            self.conn.send(job.to_row())
        except OSError as exc:
            raise ChildDied(f"handler process {self.pid} died: {exc!r}") from None
        started()
        reply: Attempt | None = await self.receive()
        return reply

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

    healthy = True
    abandoned = 0
    """Never anything to abandon: a child that does not return is killed."""

    def __init__(
        self,
        concurrency: int,
        modules: Sequence[str],
        dsn: str,
        worker_id: str,
        backoff: BackoffSettings,
        kill_grace_seconds: float,
        connection: ConnectionSettings | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.connection = connection or ConnectionSettings()
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

    async def _acquire(self) -> Child:
        async with self._freed:
            await self._freed.wait_for(lambda: bool(self._idle) or self._live < self.concurrency)
            if self._idle:
                return self._idle.pop()
            self._live += 1
        child = Child(self)
        try:
            await child.start()
        except BaseException:
            await self._lose_slot()
            child.close()
            raise
        return child

    async def _lose_slot(self) -> None:
        async with self._freed:
            self._live -= 1
            self._freed.notify()

    async def _return_to_pool(self, child: Child) -> None:
        async with self._freed:
            self._idle.append(child)
            self._freed.notify()

    async def __call__(
        self, handler: Handler, job: Job, context: Context, started: Callable[[], None]
    ) -> None:
        child = await self._acquire()
        try:
            decided = await child.run(job, started)
        except asyncio.CancelledError:
            condemned = asyncio.get_running_loop().create_task(self._condemn(child))
            try:
                await asyncio.shield(condemned)
            except asyncio.CancelledError:  # cancelled again: the loop goes away
                child.close()
            raise
        except ChildDied:
            await self._lose_slot()
            child.close()
            raise
        await self._return_to_pool(child)
        if decided is not None:
            raise Decided(decided)

    async def _condemn(self, child: Child) -> None:
        """Stop `child`'s attempt: kept if it returns within the grace period, else
        killed; either way its slot is free again only afterwards."""
        child.signal(signal.SIGUSR1)
        try:
            await asyncio.wait_for(child.receive(), timeout=self.kill_grace_seconds)
        except (TimeoutError, ChildDied):
            pass
        else:
            await self._return_to_pool(child)
            return
        if child.process.is_alive():
            log.warning("handler process %s outlived its attempt; killing it", child.pid)
            self.killed += 1
            child.signal(signal.SIGTERM)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, child.process.join, KILL_AFTER_TERM_SECONDS)
        child.close()
        await self._lose_slot()

    def close(self) -> None:
        for child in self._idle:
            child.close()
        self._idle.clear()
