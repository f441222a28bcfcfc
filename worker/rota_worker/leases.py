"""The lease keeper: which attempts this worker holds, and what their heartbeats say.

An attempt is held from its claim until its outcome is written (or known to be
lost): from WAITING until a terminal state (`rota_worker.attempts`). Held
attempts are told apart by their record, never by (job id, attempt): a job
claimed again while an earlier attempt of it still runs, or in the very
statement that gave it back, is a new record. One heartbeat statement every
lease/3 (`rota_worker.heartbeat`, from a thread of its own) extends every held
lease and brings back the cancel requests; an attempt whose lease is gone, or
whose job somebody asked to cancel, is stopped at once, so its slot is freed
and a late finish can never overlap a rerun.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

from rota import claim as claims
from rota.errors import DatabaseError, DatabaseUnavailable
from rota_worker.execute import Execution, Stop
from rota_worker.link import Link

log = logging.getLogger("rota.worker")

Key = tuple[int, int]


class LeaseKeeper:
    def __init__(self, worker_id: str, lease_seconds: float) -> None:
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._held: dict[Execution, None] = {}
        """The held records (an Execution hashes by identity). Changed on the event
        loop only; the heartbeat thread reads a copy. Each change and each copy is
        one call into the dict's C code, which another thread cannot interleave
        with (the interpreter's lock is held throughout): no lock per job."""

    def hold(self, execution: Execution) -> None:
        self._held[execution] = None

    def drop(self, execution: Execution) -> None:
        """Let go of `execution`'s lease (its outcome is settled): this record only."""
        self._held.pop(execution, None)

    def holds(self, key: Key) -> bool:
        """Whether some held attempt is (job id, attempt) `key`."""
        return any(e.key == key for e in self.snapshot())

    def snapshot(self) -> list[Execution]:
        """The held attempts, now (safe from any thread)."""
        return list(self._held.copy())

    @property
    def held(self) -> list[Execution]:
        return self.snapshot()

    def __len__(self) -> int:
        return len(self._held)

    @property
    def running(self) -> list[Execution]:
        """Held attempts whose handler has not ended yet."""
        return [e for e in self.snapshot() if e.task is not None and not e.task.done()]

    async def beat(self, link: Link) -> None:
        """Extend every held lease once, on `link`; stop attempts that lost theirs or
        were cancelled. (The worker beats from its heartbeat thread; see
        `rota_worker.heartbeat`.)"""
        executions = self.snapshot()
        held = {e.key for e in executions}
        if not held:
            return
        try:
            leases = await link.run(claims.extend_leases, self.worker_id, held, self.lease_seconds)
        except DatabaseUnavailable as exc:
            log.warning("heartbeat failed (%s); leases run on until the next one", exc)
            return
        except DatabaseError as exc:
            # Refused, not away (a grant taken back, say): the next heartbeat
            # tries again; one that never succeeds lets the leases expire.
            log.error("heartbeat refused (%s); leases run on until the next one", exc)
            return
        self.apply(executions, leases)

    def apply(
        self,
        executions: Iterable[Execution],
        leases: Iterable[claims.Lease],
        unknown: Collection[Key] = (),
    ) -> None:
        """On the event loop: what a heartbeat of `executions` found. Those whose lease
        was not extended are stopped (lost), those whose job somebody asked to cancel
        too; `unknown` keys were not renewed this time, and are left alone."""
        kept = {(lease.job_id, lease.attempts): lease for lease in leases}
        for execution in executions:
            if execution not in self._held or execution.key in unknown:
                continue  # settled meanwhile, or not known this time
            lease = kept.get(execution.key)
            if lease is None:
                if execution.task is not None and not execution.task.done():
                    log.warning("job %s attempt %s: lease lost; stopping it", *execution.key)
                execution.stop(Stop.LEASE_LOST)
            elif lease.cancel_requested:
                log.info("job %s: cancel requested; stopping attempt %s", *execution.key)
                execution.stop(Stop.CANCEL)
