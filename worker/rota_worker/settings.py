"""Worker settings: how many jobs at once, how long a lease, how to stop."""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
from collections.abc import Sequence

from rota import limits
from rota.errors import InvalidInput
from rota.reaper import ReaperSettings
from rota.settings import BackoffSettings, ConnectionSettings

ISOLATIONS = ("thread", "process")


def default_worker_id() -> str:
    """host:pid:random — unique per process, readable in locked_by."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = 10
    """Jobs run at once by this process (async handlers as tasks, sync ones in threads)."""

    lease_seconds: float = 30.0
    """How long a claim holds a job without a heartbeat; heartbeats come every third of it.
    A crashed worker's jobs run again after at most this long."""

    types: Sequence[str] | None = None
    """Job types to claim; None means every type with a registered handler."""

    poll_interval_seconds: float = 1.0
    """Longest wait between claims when no NOTIFY arrives (the fallback when
    notifications are lost, e.g. behind a transaction-mode pooler)."""

    grace_period_seconds: float = 25.0
    """On SIGTERM, how long running jobs may take to finish before the rest are given
    back (ready again, attempt not counted). Below Kubernetes' default 30 s."""

    finish_batch_size: int = 500
    """Most outcomes written per statement; completions are batched for throughput."""

    worker_id: str = dataclasses.field(default_factory=default_worker_id)
    """Written to locked_by of every claimed job."""

    run_reaper: bool = True
    """Run the reaper inside this worker."""

    run_scheduler: bool = True
    """Run the scheduler (and so the built-in archive schedule) inside this worker."""

    metrics_port: int | None = None
    """Serve /metrics, /healthz and /readyz on this port (None: no HTTP server)."""

    backoff: BackoffSettings = dataclasses.field(default_factory=BackoffSettings)
    """Delays between retries of failing jobs."""

    reaper: ReaperSettings = dataclasses.field(default_factory=ReaperSettings)
    """How the embedded reaper runs."""

    reconnect_max_seconds: float = 10.0
    """Longest wait between reconnection attempts while the database is away."""

    job_timeout_seconds: float | None = None
    """Time limit of an attempt whose job and handler set none (None: no limit)."""

    isolation: str = "thread"
    """Where sync handlers run: "thread" (cheap; a stuck thread can only be abandoned)
    or "process" (a child process per slot, killed when it outlives its attempt)."""

    kill_grace_seconds: float = 5.0
    """Process isolation: how long a stopped attempt's child may take to return
    before it gets SIGTERM (then SIGKILL two seconds later)."""

    max_jobs_per_child: int | None = None
    """Process isolation: a child that has run this many attempts is replaced by
    a fresh one (None: children live on)."""

    max_child_memory_mb: int | None = None
    """Process isolation: a child whose resident memory is past this many MiB
    after an attempt is replaced by a fresh one (None: no limit; read from /proc,
    so on Linux only)."""

    handler_modules: Sequence[str] = ()
    """Modules that register the handlers; child processes import them."""

    claim_ahead: bool = True
    """While attempts end fast, claim the next batch while the current one runs
    (see rota_worker.claiming); False: claim only into free slots."""

    connection: ConnectionSettings = dataclasses.field(default_factory=ConnectionSettings)
    """Timeouts of the worker's own connections (claims, outcomes, heartbeats, the
    registry, the listener, the services): connect timeout, TCP keepalives,
    TCP_USER_TIMEOUT, statement and lock timeouts, and the answer deadline."""

    loop_stall_seconds: float = 1.0
    """The event loop not turning for this long is a stall: logged, and counted in
    rota_worker_loop_stalls_total (a handler blocking it: time.sleep in an async def).
    Heartbeats go on from their own thread meanwhile."""

    eager_tasks: bool = True
    """On Python 3.12 and later, run the event loop with asyncio's eager task
    factory: an attempt's handler starts inside the call that starts it, and one
    that never waits ends there, without a turn of the event loop. False (and
    Python 3.11): every task starts on the loop's next turn."""

    def __post_init__(self) -> None:
        limits.whole(self.concurrency, "concurrency")  # the registry's int4 column
        limits.lease_seconds(self.lease_seconds, "--lease")
        limits.interval_seconds(self.poll_interval_seconds, "--poll-interval")
        limits.delay_seconds(self.grace_period_seconds, "--grace-period")
        limits.delay_seconds(self.kill_grace_seconds, "kill grace period")
        if self.job_timeout_seconds is not None:
            limits.timeout_seconds(self.job_timeout_seconds, "--job-timeout")
        if self.isolation not in ISOLATIONS:
            raise InvalidInput(f"isolation must be thread or process, not {self.isolation!r}")
        for name, value in [
            ("--max-jobs-per-child", self.max_jobs_per_child),
            ("--max-child-memory", self.max_child_memory_mb),
        ]:
            if value is None:
                continue
            limits.whole(value, name, 1)
            if self.isolation != "process":
                raise InvalidInput(f"{name} is for child processes: add --isolation process")
        limits.interval_seconds(self.loop_stall_seconds, "loop_stall_seconds")
        if self.finish_batch_size < 1:
            raise InvalidInput("finish_batch_size must be at least 1")

    @property
    def registry_refresh_seconds(self) -> float:
        """How often the worker's row in rota.worker is refreshed: as often as its
        leases are renewed (lease/3), on a connection of its own."""
        return self.lease_seconds / 3
