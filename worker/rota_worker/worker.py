"""The worker: claims jobs, runs their attempts, and puts the parts together.

Each part owns one concern and one connection (a `Link`):
- the claim loop (here) claims as many jobs as there are free slots, in one
  statement, and waits for a NOTIFY or the poll interval when the queue is empty;
- `OutcomeBuffer` writes finished attempts' outcomes in batches, conditional on
  the lease, and keeps them through an outage;
- `LeaseKeeper` holds every attempt (a record per claim, see
  `rota_worker.attempts`) and stops attempts that lost their lease or were
  cancelled; `Heartbeat` renews their leases from a thread and a connection of
  its own, and watches the event loop for stalls;
- `Deadlines` puts timeouts on every connection and an answer deadline on
  every call, so a connection the network stopped carrying is replaced;
- `run_attempt` runs one handler under its timeout; sync handlers run in a
  `ThreadRunner` or a `ProcessRunner`;
- the maintenance services (reaper, scheduler) run in threads of their own.
All times that matter are the database's: the host clock is never compared
with a lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import generate_latest

from rota import workers
from rota.claim import Attempt
from rota.deadlines import Deadlines
from rota.errors import DatabaseUnavailable, MigrationError, RotaError
from rota.handlers import Context, Handler, registered
from rota.jobs import Job
from rota.metrics import RUNS, MetricsSettings, worker_registry
from rota.migrate import require_current
from rota.reaper import Reaper, ReaperSettings
from rota.scheduler import Scheduler
from rota.services import Service, start_thread
from rota_worker.attempts import State
from rota_worker.claiming import ClaimLoop
from rota_worker.execute import Execution, Stop, outcome_of_error, run_attempt, timeout_of
from rota_worker.heartbeat import Heartbeat
from rota_worker.leases import LeaseKeeper
from rota_worker.link import Backoff, Link, first
from rota_worker.listener import Listener
from rota_worker.outcomes import OutcomeBuffer
from rota_worker.probes import serve
from rota_worker.processes import ProcessRunner
from rota_worker.settings import WorkerSettings
from rota_worker.threads import ThreadRunner

log = logging.getLogger("rota.worker")

STALL_SECONDS = 60.0
"""/healthz fails when the claim loop has not turned for this long."""

LINKS = ("claim-ahead", "flush", "registry")
"""The worker's connections besides the lead claim's, the listener's and the
heartbeat's (each loop owns one)."""


EAGER_TASK_FACTORY: Any = getattr(asyncio, "eager_task_factory", None)
"""asyncio's eager task factory (Python 3.12 and later; None before)."""


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
        self.context = Context(dsn, self.worker_id)
        self.leases = LeaseKeeper(self.worker_id, s.lease_seconds)
        self.deadlines = Deadlines(s.connection)
        self.outcomes = OutcomeBuffer(
            self.worker_id, s.finish_batch_size, self._settled, s.reconnect_max_seconds
        )
        self.runner: ThreadRunner | ProcessRunner = ThreadRunner(s.concurrency)
        if s.isolation == "process":
            self.runner = ProcessRunner(
                s.concurrency, s.handler_modules, dsn, self.worker_id, s.backoff,
                s.kill_grace_seconds,
            )  # fmt: skip
        self._stopping = asyncio.Event()
        self.claims = ClaimLoop(
            s, self.types, self.leases, self.outcomes, self._hold, self._begin, self._stopping
        )
        self.heartbeat = Heartbeat(
            dsn, self.leases, self.deadlines, s.loop_stall_seconds,
            self.claims.floor, self.claims.jobs_notified.set,
        )  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None
        self._eager = False
        """The loop's tasks may take their first step inside create_task (it has a
        task factory: the eager one, say)."""
        self.info = workers.WorkerInfo(self.worker_id, s.concurrency, tuple(self.types))

    def _default_services(self) -> list[Service]:
        wanted: list[tuple[bool, Service]] = [
            # The reaper retries an expired job after this worker's backoff.
            (self.settings.run_reaper, Reaper(self._reaper_settings())),
            (self.settings.run_scheduler, Scheduler()),
        ]
        return [service for on, service in wanted if on]

    def _reaper_settings(self) -> ReaperSettings:
        return dataclasses.replace(self.settings.reaper, backoff=self.settings.backoff)

    # -- control -----------------------------------------------------------
    def stop(self) -> None:
        """Ask the worker to shut down gracefully (safe from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop_now)

    def _stop_now(self) -> None:
        self._stopping.set()
        self.claims.wake()
        self.claims.end_idle_wait()

    def run(self, install_signals: bool = True) -> None:
        coro = self.run_async(install_signals=install_signals)
        if self.settings.eager_tasks and EAGER_TASK_FACTORY is not None:
            asyncio.run(coro, loop_factory=_eager_loop)  # type: ignore[call-arg,unused-ignore]
        else:
            asyncio.run(coro)

    async def run_async(self, install_signals: bool = False) -> None:
        self._loop = asyncio.get_running_loop()
        self._eager = self._loop.get_task_factory() is not None
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stop_now)
        io = ThreadPoolExecutor(max_workers=5, thread_name_prefix="rota-io")
        links = {name: Link(self.dsn, name, io, self.deadlines) for name in LINKS}
        # The lead claim first waits for a NOTIFY (at most the poll interval).
        links["claim"] = Link(
            self.dsn, "claim", io, self.deadlines, self.settings.poll_interval_seconds
        )
        listener = Listener(
            self.dsn,
            self.claims.jobs_notified,
            functools.partial(self.deadlines.connect, self.dsn, "rota-worker-listen"),
            self.deadlines.watch,
        )
        listener.start()
        probes = self._serve_probes()
        services_stop = threading.Event()
        log.info(
            "worker %s started: types=%s concurrency=%d isolation=%s",
            self.worker_id,
            ",".join(self.types) or "-",
            self.settings.concurrency,
            self.settings.isolation,
        )
        loops: list[asyncio.Task[None]] = []
        try:
            if await self._wait_until_usable(io):
                await self._registry(links["registry"], workers.register)
                for service in self.services:
                    start_thread(service, self.dsn, services_stop, deadlines=self.deadlines)
                self.heartbeat.start(self._loop)
                loops = [
                    asyncio.create_task(self.outcomes.run(links["flush"])),
                    asyncio.create_task(self.heartbeat.tick_loop()),
                    asyncio.create_task(self._refresh_registry(links["registry"])),
                ]
                await self.claims.run(links["claim"], links["claim-ahead"])
                await self._shut_down()
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._loop.run_in_executor(None, self.heartbeat.stop)
            if loops:  # registered: take the row out again
                await self._registry(links["registry"], workers.deregister)
            listener.stop()
            services_stop.set()
            if probes is not None:
                probes.shutdown()
            for link in links.values():
                link.close()
            self.runner.close()
            io.shutdown(wait=False, cancel_futures=True)
            log.info("worker %s stopped after %d jobs", self.worker_id, self.outcomes.written)

    async def _wait_until_usable(self, io: ThreadPoolExecutor) -> bool:
        """Wait until the database answers with a current schema (False: stopped first).

        A worker started before its database or its migration waits, alive for
        /healthz and not ready for /readyz, instead of exiting.
        """
        backoff = Backoff(first=0.5, most=self.settings.reconnect_max_seconds)
        while not self._stopping.is_set():
            self.claims.last_tick = time.monotonic()
            try:
                await asyncio.get_running_loop().run_in_executor(io, require_current, self.dsn)
                return True
            except (DatabaseUnavailable, MigrationError) as exc:
                delay = backoff.next()
                log.warning("waiting for the database (%s); next try in %.1fs", exc, delay)
                await first(self._stopping, timeout=delay)
        return False

    # -- running attempts -----------------------------------------------------
    def _hold(self, job: Job) -> Execution:
        """A claimed job, held (its lease renewed) from now until its outcome is settled."""
        handler = self.handlers.get(job.type)
        execution = Execution(job, timeout_of(job, handler, self.settings.job_timeout_seconds))
        self.leases.hold(execution)
        return execution

    def _begin(self, execution: Execution) -> None:
        handler = self.handlers.get(execution.job.type)
        execution.task = asyncio.create_task(self._execute(execution, handler))

    async def _execute(self, execution: Execution, handler: Handler | None) -> None:
        # Started eagerly, this runs inside create_task, before `_begin` can assign
        # the task: the attempt's clock and its stop need it from the first step.
        # It returns nothing: a task whose result were the attempt would close a
        # cycle (task, attempt, its owner the record, the record's task) that only
        # the garbage collector frees, a job at a time.
        if self._eager:
            execution.task = asyncio.current_task()
        backoff = self.settings.backoff
        try:
            attempt = await run_attempt(execution, handler, self.context, self.runner, backoff)
        except Exception as exc:  # a fault of the worker's own: the slot must not be lost
            log.exception(
                "job %s attempt %s: the attempt failed outside its handler", *execution.key
            )
            failed = outcome_of_error(execution.job, exc, backoff)
            attempt = dataclasses.replace(failed, type=execution.job.type, owner=execution)
        execution.move(State.ENDED)
        self.outcomes.add(attempt)
        self.claims.attempt_ended(attempt)

    def _settled(self, attempt: Attempt) -> None:
        """The outcome buffer is done with `attempt`: let go of its lease (the lease of
        this record: a new attempt of the same job claimed meanwhile stays held)."""
        owner: Any = attempt.owner  # an Execution, or None
        if owner is not None:
            self.leases.drop(owner)
        self.claims.wake()

    async def _refresh_registry(self, link: Link) -> None:
        """Keep this worker's row in rota.worker alive (and the queue's samples
        written), off the lease-critical path: heartbeats have their own thread."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            await self._registry(link, workers.refresh)

    async def _registry(self, link: Link, call: Callable[..., object]) -> None:
        """This worker's row in rota.worker (register, refresh, deregister); never fatal."""
        try:
            await link.run(
                call,
                self.info,
                max(workers.DEFAULT_TTL_SECONDS, 3 * self.settings.heartbeat_seconds),
            )
        except RotaError as exc:
            log.warning("worker %s: cannot update rota.worker (%s)", self.worker_id, exc)

    # -- shutdown ---------------------------------------------------------------
    async def _shut_down(self) -> None:
        """Let running jobs finish within the grace period, give back the rest."""
        grace = self.settings.grace_period_seconds
        running = [e.task for e in self.leases.running if e.task is not None]
        log.info("stopping: %d jobs running, grace period %.0fs", len(running), grace)
        if running:
            await asyncio.wait(running, timeout=grace)
        for execution in self.leases.running:
            log.warning(
                "job %s attempt %s did not finish within the grace period; given back",
                *execution.key,
            )
            execution.stop(Stop.SHUTDOWN)
        stopped = [e.task for e in self.leases.running if e.task is not None]
        if stopped:
            await asyncio.wait(stopped, timeout=5.0)
        deadline = time.monotonic() + max(grace, 5.0)
        while self.outcomes.unsettled and time.monotonic() < deadline:
            self.outcomes.wake.set()
            await asyncio.sleep(0.05)
        if self.outcomes.unsettled:
            log.error(
                "%d outcomes could not be written; their leases will expire",
                self.outcomes.unsettled,
            )

    # -- probes ---------------------------------------------------------------
    def health(self) -> str | None:
        """None when healthy, else why /healthz fails."""
        if time.monotonic() - self.claims.last_tick >= STALL_SECONDS:
            return "stalled: the claim loop has not turned for a minute"
        overdue = self.heartbeat.overdue()
        if overdue is not None:
            return overdue
        if not self.runner.healthy:
            return f"{self.runner.abandoned} handler threads are stuck (the concurrency)"
        return None

    def _serve_probes(self) -> ThreadingHTTPServer | None:
        if self.settings.metrics_port is None:
            return None
        RUNS.configure(MetricsSettings.from_env())
        RUNS.declare(self.types)
        registry = worker_registry(self.settings.concurrency, self._running_types)
        metrics = functools.partial(generate_latest, registry)
        return serve(self.settings.metrics_port, self.snapshot, self.health, metrics)

    def _running_types(self) -> list[str]:
        """The types of the jobs running now, read on the event loop (/metrics is
        served from a thread of its own)."""

        async def read() -> list[str]:
            return [e.job.type for e in self.leases.running]

        loop = self._loop
        if loop is None or loop.is_closed():
            return []
        try:
            return asyncio.run_coroutine_threadsafe(read(), loop).result(timeout=2.0)
        except (TimeoutError, RuntimeError, CancelledError):
            return []  # stopping, or the loop is stuck (then /healthz says so)

    def snapshot(self) -> dict[str, Any]:
        """State for the probes and logs."""
        return {
            "worker_id": self.worker_id,
            "ready": self.claims.ready and not self._stopping.is_set(),
            "running": len(self.leases.running),
            "pending_outcomes": self.outcomes.unsettled,
            "finished": self.outcomes.written,
            "abandoned_threads": self.runner.abandoned,
        }
