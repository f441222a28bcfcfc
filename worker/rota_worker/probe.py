"""The floor probe: jobs that became ready behind where the claims start.

A busy worker's claims start behind the jobs it claimed last (`rota.floor.Floor`).
A job can still become ready behind that point (a paused type resumed, a claim
rolled back elsewhere, a run_at given in the past): this loop (`rota_worker.loops`,
on a connection of its own) looks for such jobs every `Floor.PROBE_SECONDS`,
moves the start back to them and wakes an idle claim. A failed probe costs only
the delay of such a job: the next round tries again. Its first round runs
before the worker's first claim: it learns which types are limited, whose jobs
move starts of their own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from rota import db
from rota.floor import Floor
from rota_worker.loops import Loop

log = logging.getLogger("rota.worker")


class FloorProbe(Loop):
    name = "rota-floor-probe"

    def __init__(
        self,
        floor: Floor,
        wake_claims: Callable[[], None],
        connect: Callable[[], db.Conn],
        watch: Callable[[db.Conn], contextlib.AbstractContextManager[None]],
    ) -> None:
        super().__init__(Floor.PROBE_SECONDS, connect)
        self.floor = floor
        self.wake_claims = wake_claims
        """Wakes an idle claim (thread-safe)."""
        self._watch = watch

    def run_once(self) -> None:
        conn = self.connection()
        with self._watch(conn):
            moved = self.floor.probe(conn)
        if moved:
            log.debug("jobs ready behind the claims' start at priorities %s", moved)
            self.wake_claims()
