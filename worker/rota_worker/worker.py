"""The worker: puts the parts together, starts them in order, stops them.

It only wires and starts. Each part owns one concern (docs/worker-internals.md
draws them):
- `Attempts` (rota_worker.attempts) knows every attempt held and moves each by
  one dispatch; its RUNNING and STOPPING records are the slots taken;
- `ClaimLoop` (rota_worker.claiming) claims into free slots, carrying the
  outcomes along; `Slots` (rota_worker.slots) starts what was claimed and hands
  what ended to the `OutcomeBuffer` (rota_worker.outcomes), which writes it;
- the background loops (`rota.loops.Loop`: `LeaseRenewal`, `StallWatch`,
  `FloorProbe`, `Listener`, `Registry` for the registry row), each a thread
  doing one job on its own connection; the maintenance services (reaper,
  scheduler) on the same loop shape (`rota.services.ServiceLoop`);
- `Deadlines` puts timeouts on every connection and an answer deadline on
  every call, so a connection the network stopped carrying is replaced.
All times that matter are the database's: the host clock is never compared
with a lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rota import workers
from rota.deadlines import Deadlines
from rota.durable import RunConnections
from rota.errors import DatabaseUnavailable, MigrationError, one_line
from rota.handlers import Context, Handler, registered
from rota.migrate import require_current
from rota.reaper import Reaper, ReaperSettings
from rota.scheduler import Scheduler
from rota.services import Service, start_thread
from rota_worker.attempts import Attempts, Execution, State
from rota_worker.claiming import ClaimLoop
from rota_worker.leases import LeaseRenewal
from rota_worker.link import Backoff, Link, first
from rota_worker.listener import Listener
from rota_worker.loops import Loop
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.probe import FloorProbe
from rota_worker.probes import Probes
from rota_worker.processes import ProcessRunner, Wear
from rota_worker.reaping import ReaperLoop
from rota_worker.registry import Registry
from rota_worker.settings import WorkerSettings
from rota_worker.slots import Slots
from rota_worker.stalls import StallWatch
from rota_worker.threads import ThreadRunner

log = logging.getLogger("rota.worker")

LINKS = ("claim-ahead", "flush")
"""The event loop's connections besides the lead claim's (each user owns one);
the background loops own theirs (heartbeat, floor probe, listener, registry)."""


EAGER_TASK_FACTORY: Any = getattr(asyncio, "eager_task_factory", None)
"""asyncio's eager task factory (Python 3.12 and later; None before)."""


LEFT_BEHIND_SECONDS = 1.0
"""How long the loop's end waits for tasks it cancels (asyncio.run waits for ever)."""


def run_loop(
    coro: Coroutine[Any, Any, None], loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> int:
    """Run `coro` to its end as `asyncio.run` does, but give the tasks still
    running then at most LEFT_BEHIND_SECONDS after their cancellation: a task
    that swallows every cancellation (an async handler's) is left behind, not
    waited for. Returns how many were."""
    loop = loop_factory()
    asyncio.set_event_loop(loop)
    left = 0
    try:
        loop.run_until_complete(coro)
    finally:
        try:
            left = _cancel_the_rest(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(_executor_shut_down(loop))
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    return left


EXECUTOR_JOIN_SECONDS = 300.0
"""How long the loop's end waits for the default executor's threads (asyncio.run's
bound from Python 3.12 on; 3.11's waits for ever)."""


async def _executor_shut_down(loop: asyncio.AbstractEventLoop) -> None:
    if sys.version_info >= (3, 12):
        await loop.shutdown_default_executor(EXECUTOR_JOIN_SECONDS)
    else:
        await loop.shutdown_default_executor()


def _cancel_the_rest(loop: asyncio.AbstractEventLoop) -> int:
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if not pending:
        return 0
    done, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=LEFT_BEHIND_SECONDS))
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {"message": "unhandled exception as the worker stopped", "task": task,
                 "exception": task.exception()}
            )  # fmt: skip
    _LEFT_BEHIND.extend(stuck)  # kept: destroyed pending, each would log an error
    return len(stuck)


_LEFT_BEHIND: list[asyncio.Task[Any]] = []


def _eager_loop() -> asyncio.AbstractEventLoop:
    """A new event loop whose tasks take their first step inside create_task: a
    no-op handler's attempt ends there, with no turn of the loop in between (see
    WorkerSettings.eager_tasks)."""
    loop = asyncio.new_event_loop()
    loop.set_task_factory(EAGER_TASK_FACTORY)
    return loop


class Worker:
    def __init__(
        self,
        dsn: str,
        settings: WorkerSettings | None = None,
        handlers: dict[str, Handler] | None = None,
        services: Sequence[Service] | None = None,
    ) -> None:
        self.dsn = dsn
        self.settings = s = settings or WorkerSettings()
        self.handlers = handlers if handlers is not None else registered()
        self.types = sorted(s.types) if s.types is not None else sorted(self.handlers)
        self.services = list(services) if services is not None else self._default_services()
        self.worker_id = s.worker_id
        runs = RunConnections(dsn, s.concurrency, s.connection)
        self.context = Context(dsn, self.worker_id, connections=runs)
        self.deadlines = d = Deadlines(s.connection)
        self.attempts = Attempts(s.concurrency, s.lease_seconds)
        self.outcomes = OutcomeBuffer(
            self.worker_id, s.finish_batch_size, self.attempts, s.reconnect_max_seconds
        )
        self.runner: ThreadRunner | ProcessRunner = ThreadRunner(s.concurrency)
        if s.isolation == "process":
            self.runner = ProcessRunner(
                s.concurrency, s.handler_modules, dsn, self.worker_id, s.backoff,
                s.kill_grace_seconds, s.connection,
                Wear(s.max_jobs_per_child, s.max_child_memory_mb),
            )  # fmt: skip
        self._stopping = asyncio.Event()
        self.left_behind = 0
        """Tasks still running after the loop's end cancelled them (see `run_loop`)."""
        self.slots = Slots(
            s, self.attempts, self.outcomes, self.handlers, self.context, self.runner,
            slot_freed=self._wake_claims,
        )  # fmt: skip
        self.attempts.settled = self._settled
        self.claims = ClaimLoop(
            s, self.types, self.attempts, self.outcomes, self.slots, self._stopping
        )
        connect = functools.partial(d.connect, dsn)
        self.leases = LeaseRenewal(
            self.worker_id, self.attempts,
            functools.partial(connect, "rota-worker-heartbeat", lock_timeout=True),
            d.watch, s.reconnect_max_seconds, s.connection.answer_timeout_seconds,
        )  # fmt: skip
        self.stalls = StallWatch(s.loop_stall_seconds)
        self.probe = FloorProbe(
            self.claims.floor, self.claims.jobs_notified.set,
            functools.partial(connect, "rota-worker-floor"), d.watch,
        )  # fmt: skip
        self.listener = Listener(
            dsn, self.claims.jobs_notified,
            functools.partial(connect, "rota-worker-listen"), d.watch,
        )  # fmt: skip
        self.info = workers.WorkerInfo(self.worker_id, s.concurrency, tuple(self.types))
        self.registry = Registry(
            self.info, s.registry_refresh_seconds,
            functools.partial(connect, "rota-worker-registry"), d.watch,
            s.reconnect_max_seconds,
        )  # fmt: skip
        self.loops: list[Loop] = [
            self.listener, self.registry, self.leases, self.stalls, self.probe
        ]  # fmt: skip
        """The background loops, in start order (the listener first: its wake-up
        may come before the first claim)."""
        self.probes = Probes(self)
        self.reaping: ReaperLoop | None = None
        """The reaper's loop while it runs in this worker."""
        self._waited = False
        """The database was away when the worker started (see `_start_service`)."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def _default_services(self) -> list[Service]:
        wanted: list[tuple[bool, Service]] = [
            # The reaper retries an expired job after this worker's backoff.
            (self.settings.run_reaper, Reaper(self._reaper_settings())),
            (self.settings.run_scheduler, Scheduler()),
        ]
        return [service for on, service in wanted if on]

    def _reaper_settings(self) -> ReaperSettings:
        return dataclasses.replace(self.settings.reaper, backoff=self.settings.backoff)

    def _wake_claims(self) -> None:
        self.claims.wake()

    def _settled(self, record: Execution) -> None:
        if record.state is State.SUSPENDED and self.reaping is not None:
            self.reaping.recheck()  # its job may come due before the reaper's next pass
        self._wake_claims()

    # -- control -----------------------------------------------------------
    def stop(self) -> None:
        """Ask the worker to shut down gracefully (safe from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop_now)

    def _stop_now(self) -> None:
        if not self._stopping.is_set():
            self.slots.stopped_at = self.slots.clock()
        self._stopping.set()
        self.slots.stopping = True
        self.claims.wake()
        self.claims.statements.end_idle_wait()

    def run(self, install_signals: bool = True) -> None:
        coro = self.run_async(install_signals=install_signals)
        eager = self.settings.eager_tasks and EAGER_TASK_FACTORY is not None
        self.left_behind = run_loop(coro, _eager_loop if eager else asyncio.new_event_loop)

    async def run_async(self, install_signals: bool = False) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self.slots.eager = loop.get_task_factory() is not None
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop_now)
        io = ThreadPoolExecutor(max_workers=5, thread_name_prefix="rota-io")
        links = {name: Link(self.dsn, name, io, self.deadlines) for name in LINKS}
        # The lead claim first waits for a NOTIFY (at most the poll interval).
        links["claim"] = Link(
            self.dsn, "claim", io, self.deadlines, self.settings.poll_interval_seconds
        )
        server = self.probes.serve()  # first: a port it cannot take ends the start
        self.listener.start()
        services_stop = threading.Event()
        log.info(
            "worker %s started: types=%s concurrency=%d isolation=%s",
            self.worker_id,
            ",".join(self.types) or "-",
            self.settings.concurrency,
            self.settings.isolation,
        )
        tasks: list[asyncio.Task[None]] = []
        try:
            if await self._wait_until_usable(io):
                await loop.run_in_executor(io, self.registry.register)
                self.registry.start()
                for service in self.services:
                    self._start_service(service, services_stop, self._waited)
                self.leases.start_on(loop)
                self.stalls.start()
                # Its first round before the first claim: which types are
                # limited, so that the claims' starts know from the first.
                await loop.run_in_executor(io, self.probe.step)
                self.probe.start()
                tasks = [
                    asyncio.create_task(self.outcomes.run(links["flush"])),
                    asyncio.create_task(self.stalls.tick()),
                ]
                await self.claims.run(links["claim"], links["claim-ahead"])
                await self.slots.drain(self.settings.grace_period_seconds)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.run_in_executor(None, self._stop_loops)
            await loop.run_in_executor(io, self.registry.deregister)
            services_stop.set()
            if self.reaping is not None:
                self.reaping.recheck()  # ends its wait
            if server is not None:
                server.shutdown()
            for link in links.values():
                link.close()
            self.runner.close()
            if self.context.connections is not None:
                self.context.connections.close()
            io.shutdown(wait=False, cancel_futures=True)
            log.info("worker %s stopped after %d jobs", self.worker_id, self.outcomes.written)

    def _start_service(self, service: Service, stop: threading.Event, away: bool) -> None:
        """`away`: the worker waited for its database, and so may other workers
        holding leases: the reaper starts as after failed passes (its recovery grace)."""
        if isinstance(service, Reaper):
            self.reaping = ReaperLoop(service, self.dsn, stop, self.deadlines, away)
            self.reaping.start()
        else:
            start_thread(service, self.dsn, stop, deadlines=self.deadlines, away=away)

    def _stop_loops(self) -> None:
        for background in reversed(self.loops):
            background.stop()

    async def _wait_until_usable(self, io: ThreadPoolExecutor) -> bool:
        """Wait until the database answers with a current schema (False: stopped first).

        A worker started before its database or its migration waits, alive for
        /healthz and not ready for /readyz, instead of exiting. A connection
        option libpq refuses is no outage: its `ConnectionOptionRefused` ends
        the run at once.
        """
        backoff = Backoff(first=0.5, most=self.settings.reconnect_max_seconds)
        self._waited = False
        while not self._stopping.is_set():
            self.claims.last_tick = time.monotonic()
            try:
                await asyncio.get_running_loop().run_in_executor(io, require_current, self.dsn)
                return True
            except (DatabaseUnavailable, MigrationError) as exc:
                self._waited = True
                delay = backoff.next()
                log.warning(
                    "waiting for the database (%s); next try in %.1fs", one_line(exc), delay
                )
                await first(self._stopping, timeout=delay)
        return False

    # -- probes -----------------------------------------------------------------
    def health(self) -> str | None:
        """None when healthy, else why /healthz fails."""
        return self.probes.health()

    def snapshot(self) -> dict[str, Any]:
        """State for the probes and logs."""
        return {
            "worker_id": self.worker_id,
            "ready": self.claims.ready and not self._stopping.is_set(),
            "running": self.attempts.slots_taken,
            "pending_outcomes": self.outcomes.unsettled,
            "finished": self.outcomes.written,
            "abandoned_threads": self.runner.abandoned,
        }
