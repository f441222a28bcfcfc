"""The claim's lanes and the statements they send.

A lane is one claim connection and where its claims stand: the lead lane, and
the second one while claiming ahead, so that two claims can be in flight at
once. `Claims` sends a lane's claim: with the outcomes it carries, in one
transaction, or (an idle lead lane) after waiting for a NOTIFY in the lane's
I/O thread. Both start where the claim floor says (`rota.floor.Floor`).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence

from rota import claim as claims
from rota.attempt import Attempt, Key
from rota.db import Conn
from rota.floor import Floor
from rota.jobs import Job, Status
from rota_worker.link import Backoff, Link
from rota_worker.settings import WorkerSettings


class LaneState(enum.StrEnum):
    """Where a lane's claims stand after its last answer."""

    CLAIMING = "claiming"
    """Its claims carry the pending outcomes along."""
    IDLE = "idle"
    """Its last claim found the queue empty: the lead lane's next claim waits for a
    NOTIFY (or the poll interval) and carries no outcomes."""
    REFUSED = "refused"
    """The database refused its last claim: the next one carries no outcomes, which
    the buffer writes meanwhile."""


class Lane:
    """One claim connection and where its claims stand."""

    def __init__(self, link: Link | None, lead: bool, reconnect_max: float = 10.0) -> None:
        self._link = link
        self.lead = lead
        """The first lane; the second claims only ahead of fast jobs."""
        self.state = LaneState.CLAIMING
        self.asked = 0
        """Jobs asked for by this lane's claim in flight."""
        self.backoff = Backoff(most=reconnect_max)

    @property
    def link(self) -> Link:
        assert self._link is not None
        return self._link

    @property
    def waits_for_notify(self) -> bool:
        """Its (next or current) claim waits for a NOTIFY in its I/O thread."""
        return self.lead and self.state is LaneState.IDLE

    @property
    def carries_outcomes(self) -> bool:
        return not self.waits_for_notify and self.state is not LaneState.REFUSED


class Claims:
    """What a lane sends: the claim statements, where they start, and the NOTIFY wait."""

    def __init__(self, settings: WorkerSettings, types: Sequence[str]) -> None:
        self.settings = settings
        self.types = list(types)
        self.floor = Floor(self.types)
        """Where each priority's claim starts (the floor probe lowers it)."""
        self.jobs_notified = threading.Event()
        """Set by the listener thread when a job that can run now was enqueued (and
        when the worker stops): an idle claim waits for it."""
        self.closed = False
        """The worker stops, or the lanes are done: an idle claim still waiting for a
        NOTIFY returns without claiming."""

    async def send(
        self, lane: Lane, free: int, batch: list[Attempt]
    ) -> tuple[dict[Key, Status], list[Job]]:
        """One claim of up to `free` jobs on `lane`, writing `batch` in its transaction
        (an idle lead lane first waits for a NOTIFY, and carries no outcomes)."""
        if lane.waits_for_notify:
            return await lane.link.run(self._claim_when_notified, free)
        s = self.settings
        since, limited, generation = self.floor.bounds()
        written, jobs = await lane.link.run(
            claims.write_and_claim,
            s.worker_id,
            batch,
            free,
            s.lease_seconds,
            self.types,
            None,
            since,
            limited,
        )
        self.floor.claimed(jobs, generation)
        return written, jobs

    def _claim_when_notified(self, conn: Conn, limit: int) -> tuple[dict[Key, Status], list[Job]]:
        """In the lead lane's I/O thread: wait for a NOTIFY of a job that can run now
        (or the poll interval), then claim at once. The listener thread wakes this
        thread directly: the event loop and a thread hand-off are not in between,
        which takes about a tenth of the enqueue-to-start time off an idle worker."""
        self.jobs_notified.wait(self.settings.poll_interval_seconds)
        self.jobs_notified.clear()
        if self.closed:
            return {}, []
        s = self.settings
        since, limited, generation = self.floor.bounds()
        jobs = claims.claim(
            conn, s.worker_id, limit, s.lease_seconds, self.types, None, since, limited
        )
        self.floor.claimed(jobs, generation)
        return {}, jobs

    def end_idle_wait(self) -> None:
        """Wake an idle claim waiting for a NOTIFY; it returns without claiming (the
        worker stops, or the lanes are done)."""
        self.closed = True
        self.jobs_notified.set()
