"""The worker's reaper loop: its next pass brought forward by this worker's
suspensions.

The reaper waits until the earliest lease expires or waiting job comes due
(`rota.reaper.Reaper.next_wait`), as it stands after its pass. A job this
worker suspends afterwards (a durable job's `sleep`, a `wait_for` with a
timeout) may come due sooner: the worker then asks the loop to `recheck`, and
the loop asks the database again how long to wait (one short index lookup,
at most one per `RECHECK_GAP_SECONDS`), so that the job wakes on time rather
than at the pass after.
"""

from __future__ import annotations

import threading
import time

from rota import db
from rota.deadlines import Deadlines
from rota.errors import one_line
from rota.services import Phase, Service, ServiceLoop

RECHECK_GAP_SECONDS = 0.05
"""Least time between two rechecks: a burst of suspensions asks the database once."""


class ReaperLoop(ServiceLoop):
    """`rota.services.ServiceLoop` whose wait a `recheck` shortens."""

    def __init__(
        self,
        service: Service,
        dsn: str,
        stop: threading.Event,
        deadlines: Deadlines,
        away: bool = False,
    ) -> None:
        super().__init__(service, dsn, stop, deadlines, away=away)
        self._asked = threading.Condition()
        self._sooner = False

    def recheck(self) -> None:
        """A job may come due before the next pass: ask again (safe from any thread;
        also ends the wait once the loop is stopping)."""
        with self._asked:
            self._sooner = True
            self._asked.notify()

    def wait(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not self.stopping and (left := end - time.monotonic()) > 0:
            with self._asked:
                sooner = self._asked.wait_for(lambda: self._sooner or self.stopping, left)
                self._sooner = False
            if sooner and not self.stopping:
                end = min(end, time.monotonic() + self._next_wait())
                self._stop.wait(min(RECHECK_GAP_SECONDS, max(end - time.monotonic(), 0.0)))
        return self.stopping

    def _next_wait(self) -> float:
        """How long until the reaper has something to do (the interval if unknown;
        the end of its recovery grace while that runs)."""
        if self.recovery.phase is Phase.RECOVERING:
            return self.recovery.left() + 0.01
        try:
            return self.service.next_wait(self.connection())
        except Exception as exc:  # a loop outlives whatever one round meets
            self.log.warning("%s: asking for the next pass failed (%s)", self.name, one_line(exc))
            if db.is_unavailable(exc):
                self.close()
            return self.service.interval_seconds
