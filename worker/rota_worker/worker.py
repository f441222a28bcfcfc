"""The worker: claim loop, handler execution, batched completions, heartbeats, shutdown.

Loops, each with its own connection:
- claim: claims as many jobs as there are free slots, in one statement; when the
  queue is empty it waits for a NOTIFY or the poll interval;
- flush: writes finished jobs' outcomes in batches, each conditional on the
  lease, and keeps them in memory while the database is away;
- heartbeat: extends the leases of every job claimed and not yet written;
- services: the reaper and the scheduler, unless turned off.
All times that matter are the database's: the host clock is never compared
with a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import generate_latest

from rota import claim as claims
from rota.claim import Finish, Finished
from rota.errors import DatabaseUnavailable, MigrationError
from rota.handlers import Context, Handler, registered
from rota.jobs import Job
from rota.metrics import build_registry
from rota.migrate import require_current
from rota_worker.execute import Ran, run_handler
from rota_worker.link import Backoff, Link
from rota_worker.listener import Listener
from rota_worker.outcomes import record, settle_unwritten
from rota_worker.probes import serve
from rota_worker.services import Service, default_services, run_service, start_scheduler
from rota_worker.settings import WorkerSettings

log = logging.getLogger("rota.worker")


class Worker:
    def __init__(
        self,
        dsn: str,
        settings: WorkerSettings | None = None,
        handlers: dict[str, Handler] | None = None,
        services: Sequence[Service] | None = None,
    ) -> None:
        self.dsn = dsn
        self.settings = settings or WorkerSettings()
        self.handlers = handlers if handlers is not None else registered()
        types = self.settings.types
        self.types = sorted(types) if types is not None else sorted(self.handlers)
        self.services = list(services) if services is not None else default_services(self.settings)
        self.worker_id = self.settings.worker_id
        self.context = Context(dsn, self.worker_id)
        self.ready = False
        self.last_tick = time.monotonic()
        self.finished_count = 0
        self._held: dict[int, Job] = {}
        self._executing: dict[int, asyncio.Task[None]] = {}
        self._pending: list[Ran] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- control -----------------------------------------------------------
    def stop(self) -> None:
        """Ask the worker to shut down gracefully (safe from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    def run(self, install_signals: bool = True) -> None:
        asyncio.run(self.run_async(install_signals=install_signals))

    async def run_async(self, install_signals: bool = False) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._flush_wake = asyncio.Event()
        self._jobs_notified = asyncio.Event()
        if install_signals:
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stopping.set)
        io = ThreadPoolExecutor(max_workers=4 + len(self.services), thread_name_prefix="rota-io")
        threads = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="rota-job")
        links = {name: Link(self.dsn, name, io) for name in ("claim", "flush", "heartbeat")}
        listener = Listener(self.dsn, self._loop, self._jobs_notified)
        listener.start()
        probes = self._serve_probes()
        log.info(
            "worker %s started: types=%s concurrency=%d",
            self.worker_id,
            ",".join(self.types) or "-",
            self.settings.concurrency,
        )
        loops: list[asyncio.Task[None]] = []
        scheduler_stop = threading.Event()
        try:
            if await self._wait_until_usable(io):
                loops = self._start_loops(links, io, scheduler_stop)
                await self._claim_loop(links["claim"], threads)
                await self._shut_down()
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            listener.stop()
            scheduler_stop.set()
            if probes is not None:
                probes.shutdown()
            for link in links.values():
                link.close()
            threads.shutdown(wait=False, cancel_futures=True)
            io.shutdown(wait=False, cancel_futures=True)
            log.info("worker %s stopped after %d jobs", self.worker_id, self.finished_count)

    def _start_loops(
        self, links: dict[str, Link], io: ThreadPoolExecutor, scheduler_stop: threading.Event
    ) -> list[asyncio.Task[None]]:
        """Every loop but the claim loop: outcomes, heartbeats, maintenance services."""
        if self.settings.run_scheduler:
            start_scheduler(self.dsn, scheduler_stop)
        return [
            asyncio.create_task(self._flush_loop(links["flush"])),
            asyncio.create_task(self._heartbeat_loop(links["heartbeat"])),
            *(
                asyncio.create_task(run_service(s, self.dsn, io, self._stopping))
                for s in self.services
            ),
        ]

    async def _wait_until_usable(self, io: ThreadPoolExecutor) -> bool:
        """Wait until the database answers with a current schema (False: stopped first).

        A worker started before its database or its migration (a fresh cluster,
        a restart, an upgrade whose migration Job still runs) waits, alive for
        /healthz and not ready for /readyz, instead of exiting.
        """
        backoff = Backoff(first=0.5, most=self.settings.reconnect_max_seconds)
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            self.last_tick = time.monotonic()
            try:
                await loop.run_in_executor(io, require_current, self.dsn)
                return True
            except (DatabaseUnavailable, MigrationError) as exc:
                delay = backoff.next()
                log.warning("waiting for the database (%s); next try in %.1fs", exc, delay)
                await _first(self._stopping, timeout=delay)
        return False

    # -- claiming and running -----------------------------------------------
    async def _claim_loop(self, link: Link, threads: ThreadPoolExecutor) -> None:
        backoff = Backoff(most=self.settings.reconnect_max_seconds)
        wake = self._jobs_notified
        while not self._stopping.is_set():
            self.last_tick = time.monotonic()
            # Slots are free when a job can start *and* the jobs held (running,
            # or finished with outcomes not yet written) stay under twice the
            # concurrency: a fast queue must not claim faster than it writes.
            free = min(
                self.settings.concurrency - len(self._executing),
                2 * self.settings.concurrency - len(self._held),
            )
            if free <= 0:
                self._slot_freed.clear()
                await _first(self._slot_freed, self._stopping)
                continue
            wake.clear()
            try:
                jobs = await link.run(
                    claims.claim, self.worker_id, free, self.settings.lease_seconds, self.types
                )
            except DatabaseUnavailable as exc:
                self.ready = False
                delay = backoff.next()
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                await _first(self._stopping, timeout=delay)
                continue
            self.ready = True
            backoff.reset()
            for job in jobs:
                self._held[job.id] = job
                self._executing[job.id] = asyncio.create_task(self._execute(job, threads))
            if len(jobs) < free:
                await _first(wake, self._stopping, timeout=self.settings.poll_interval_seconds)

    async def _execute(self, job: Job, threads: ThreadPoolExecutor) -> None:
        ran = await run_handler(
            job, self.handlers.get(job.type), self.context, threads, self.settings.backoff
        )
        self._done(job.id, ran)

    def _done(self, job_id: int, ran: Ran) -> None:
        self._executing.pop(job_id, None)
        self._slot_freed.set()
        self._pending.append(ran)
        self._flush_wake.set()

    # -- writing outcomes ---------------------------------------------------
    async def _flush_loop(self, link: Link) -> None:
        backoff = Backoff(most=self.settings.reconnect_max_seconds)
        while True:
            await self._flush_wake.wait()
            self._flush_wake.clear()
            while self._pending:
                batch = self._pending[: self.settings.finish_batch_size]
                try:
                    rows = await link.run(
                        claims.finish, self.worker_id, [ran.finish for ran in batch]
                    )
                    written = {w.job_id: w for w in rows}
                    unwritten = [r for r in batch if r.finish.job_id not in written]
                    lost = await settle_unwritten(link, self.worker_id, unwritten)
                except DatabaseUnavailable as exc:
                    delay = backoff.next()
                    log.warning(
                        "%d outcomes wait for the database (%s); retry in %.1fs",
                        len(self._pending),
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                del self._pending[: len(batch)]
                self._settle(batch, written, lost)

    def _settle(self, batch: list[Ran], written: dict[int, Finished], lost: set[int]) -> None:
        self._slot_freed.set()
        for ran in batch:
            job = self._held.pop(ran.finish.job_id, None)
            job_type = job.type if job else "unknown"
            record(ran, written.get(ran.finish.job_id), job_type, ran.finish.job_id in lost)
            self.finished_count += 1

    # -- leases ---------------------------------------------------------------
    async def _heartbeat_loop(self, link: Link) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            held = {job_id: job.attempts for job_id, job in self._held.items()}
            if not held:
                continue
            try:
                kept = await link.run(
                    claims.extend_leases, self.worker_id, held, self.settings.lease_seconds
                )
            except DatabaseUnavailable as exc:
                log.warning("heartbeat failed (%s); leases run on until the next one", exc)
                continue
            for job_id in set(held) - kept:
                if job_id in self._held and job_id in self._executing:
                    log.warning("job %s: lease lost; its outcome will not be written", job_id)

    # -- shutdown ---------------------------------------------------------------
    async def _shut_down(self) -> None:
        """Let running jobs finish within the grace period, give back the rest."""
        grace = self.settings.grace_period_seconds
        running = list(self._executing.values())
        log.info("stopping: %d jobs running, grace period %.0fs", len(running), grace)
        if running:
            await asyncio.wait(running, timeout=grace)
        for job_id, task in list(self._executing.items()):
            task.cancel()
            job = self._held[job_id]
            log.warning("job %s did not finish within the grace period; given back", job_id)
            self._done(
                job_id,
                Ran(
                    Finish(
                        job.id, job.attempts, "release", 0.0, error="Released: worker shut down"
                    ),
                    0.0,
                ),
            )
        deadline = time.monotonic() + max(grace, 5.0)
        while self._pending and time.monotonic() < deadline:
            self._flush_wake.set()
            await asyncio.sleep(0.05)
        if self._pending:
            log.error(
                "%d outcomes could not be written; their leases will expire", len(self._pending)
            )

    def _serve_probes(self) -> ThreadingHTTPServer | None:
        if self.settings.metrics_port is None:
            return None
        metrics = functools.partial(generate_latest, build_registry(self.dsn))
        return serve(self.settings.metrics_port, self.snapshot, lambda: self.last_tick, metrics)

    def snapshot(self) -> dict[str, Any]:
        """State for the probes and logs."""
        return {
            "worker_id": self.worker_id,
            "ready": self.ready and not self._stopping.is_set(),
            "running": len(self._executing),
            "pending_outcomes": len(self._pending),
            "finished": self.finished_count,
        }


async def _first(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Wait until any of `events` is set, or `timeout` passes."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waiters, return_exceptions=True)
