"""Sync handlers in child processes (``--isolation process``): killable, at a cost.

Each child runs one attempt at a time and lives on between attempts; it imports
the handler modules itself when it starts (spawn, not fork: a forked copy of a
threaded asyncio process is not safe), and logs at its worker's level and in
its format. When an attempt is stopped, its child is
condemned: it gets SIGUSR1 (the handler sees ``job.cancelled`` set), SIGTERM
after the grace period and SIGKILL two seconds later. A child ignores SIGINT
and SIGTERM until it is condemned: a signal to the whole process group
reaches it, and the parent's shutdown decides. The attempt ends, and
its slot is free for a fresh child, only once the condemned one returned or is
dead: two children never run in one slot. A condemned child that returns in
time is kept. A child worn out by its attempts (`Wear`: a number of them, or
its resident memory after one) is retired between attempts: its pipe closes,
it closes its connection and exits, and the next attempt of its slot starts a
fresh child. Costs: a start-up of a Python interpreter per child (and per
replacement), payloads and outcomes pickled over a pipe, and memory for
`concurrency` interpreters.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from rota import limits, logs
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

RETIRE_SECONDS = 5.0
"""How long a retired child may take to close its connection and exit before
it is killed."""


@dataclasses.dataclass(frozen=True)
class Wear:
    """When a child is retired, between two attempts (None: never for that reason)."""

    max_jobs: int | None = None
    """After this many attempts."""
    max_memory_mb: int | None = None
    """Once its resident memory after an attempt is past this many MiB."""

    def worn(self, child: Child) -> str | None:
        """Why `child` retires now, or None."""
        if self.max_jobs is not None and child.runs >= self.max_jobs:
            return f"after {child.runs} jobs"
        if self.max_memory_mb is not None:
            resident = child.resident_mb()
            if resident is not None and resident > self.max_memory_mb:
                return f"at {resident:.0f} MiB resident, past {self.max_memory_mb}"
        return None


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def log_setup() -> tuple[int, str]:
    """The level and format ("text" or "json") of this process's log lines: a
    child started now logs as its worker does (a spawned child starts with none)."""
    root = logging.getLogger()
    json_lines = any(isinstance(h.formatter, logs.JsonFormatter) for h in root.handlers)
    return root.getEffectiveLevel(), "json" if json_lines else "text"


def _child_main(
    conn: multiprocessing.connection.Connection,
    modules: Sequence[str],
    dsn: str,
    worker_id: str,
    backoff: BackoffSettings,
    connection: ConnectionSettings,
    logging_as: tuple[int, str],
) -> None:
    """A child's life: import the handlers, then run one attempt per message."""
    logs.configure(*logging_as)
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
        except EOFError:  # retired, or the parent is gone
            runs.close()
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
                reply = Attempt.of(job, Outcome.DONE, result=result)
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
                log_setup(),
            ),
            name="rota-job-process",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.runs = 0
        """Attempts this child has run (returned or condemned)."""

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def resident_mb(self) -> float | None:
        """The child's resident memory in MiB (None where /proc does not tell)."""
        try:
            with open(f"/proc/{self.pid}/statm", "rb") as statm:
                pages = int(statm.read().split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return pages * _PAGE_BYTES / (1024 * 1024)

    async def receive(self) -> Any:
        """The child's next message (ChildDied when it has none to give)."""
        loop = asyncio.get_running_loop()
        message: asyncio.Future[Any] = loop.create_future()
        # The number, not the pipe's fileno(): a pipe closed meanwhile (the
        # worker's stop closes a condemned child's) has none to give.
        fd = self.conn.fileno()

        def readable() -> None:
            loop.remove_reader(fd)
            try:
                message.set_result(self.conn.recv())
            except (EOFError, OSError) as exc:
                message.set_exception(ChildDied(f"handler process {self.pid} died: {exc!r}"))

        loop.add_reader(fd, readable)
        try:
            return await message
        except asyncio.CancelledError:
            loop.remove_reader(fd)
            raise

    async def start(self) -> None:
        if await self.receive() != READY:  # pragma: no cover - a protocol slip
            raise ChildDied(f"handler process {self.pid} did not start")

    async def run(self, job: Job, started: Callable[[], None]) -> Attempt | None:
        self.runs += 1
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

    def retire(self) -> None:
        """Let the child exit by itself (its pipe closed), killed if it takes long."""
        with contextlib.suppress(Exception):
            self.conn.close()
        self.process.join(timeout=RETIRE_SECONDS)
        self.close()


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
        wear: Wear | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.connection = connection or ConnectionSettings()
        self.modules = list(modules)
        self.dsn = dsn
        self.worker_id = worker_id
        self.backoff = backoff
        self.kill_grace_seconds = kill_grace_seconds
        self.wear = wear or Wear()
        self._retiring: set[asyncio.Task[None]] = set()
        self._idle: list[Child] = []
        self._live = 0
        self._freed = asyncio.Condition()
        self.killed = 0
        """Children killed because they outlived their attempt's stop."""
        self.retired = 0
        """Children retired because they were worn (`Wear`)."""

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
        """The child takes its slot's next attempt, unless it is worn: then it
        exits, and the slot's next attempt starts a fresh one."""
        if why := self.wear.worn(child):
            log.info("handler process %s retired %s", child.pid, why)
            self.retired += 1
            retiring = asyncio.get_running_loop().create_task(self._retire(child))
            self._retiring.add(retiring)
            retiring.add_done_callback(self._retiring.discard)
            return
        async with self._freed:
            self._idle.append(child)
            self._freed.notify()

    async def _retire(self, child: Child) -> None:
        """Off the attempt's path: its outcome does not wait for the exit. The
        slot is free once the child is gone."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, child.retire)
        finally:
            await self._lose_slot()

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
