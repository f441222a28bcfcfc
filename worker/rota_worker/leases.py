"""Lease renewal that nothing in a handler can stop: the one path that renews.

Leases are renewed by a loop of their own (`rota_worker.loops`), in a thread
and on a connection of its own, not from the event loop the async handlers
share: an async handler that blocks the loop (``time.sleep`` in an ``async
def``) cannot cost its neighbours their leases. The statement runs under a lock
timeout and every call under an answer deadline (`rota.deadlines.Deadlines`),
so a row lock or a half-open socket cannot hang it either.

One round renews every held lease (each record of `rota_worker.attempts` from
its claim until it is settled) in one statement. If the statement is refused
(a row locked past the lock timeout by a handler's own transaction, say), the
leases are renewed one per statement, so that one locked row holds back no
other; keys still refused are *unknown*: not renewed this time and not taken
for lost. What the round found goes to the event loop (`Attempts.renewed`),
which stops the attempts whose lease is gone or whose job somebody asked to
cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from rota import claim as claims
from rota import db
from rota.attempt import Key, Lease
from rota.errors import DatabaseError, one_line
from rota_worker.attempts import Attempts
from rota_worker.loops import Loop

log = logging.getLogger("rota.worker")


class LeaseRenewal(Loop):
    name = "rota-heartbeat"

    def __init__(
        self,
        worker_id: str,
        attempts: Attempts,
        connect: Callable[[], db.Conn],
        watch: Callable[[db.Conn], contextlib.AbstractContextManager[None]],
        reconnect_max_seconds: float = 10.0,
        answer_seconds: float = 40.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(attempts.lease_seconds / 3, connect, reconnect_max_seconds)
        self.worker_id = worker_id
        self.attempts = attempts
        self._watch = watch
        self._clock = clock
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop that applies what a round found (set at start)."""
        self.stuck_seconds = attempts.lease_seconds + reconnect_max_seconds + answer_seconds
        """No round ending for this long is a stuck heartbeat: rounds come every
        third of a lease, or a backoff step (at most `reconnect_max_seconds`)
        after a failed one, and each ends within the answer deadline
        (`answer_seconds`) however the database is."""
        self.last_round = clock()
        """When a round last ended, its leases renewed or not."""

    def start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the thread (on the event loop, which then turns: the time spent
        waiting for the database before is no missed renewal)."""
        self.loop = loop
        self.last_round = self._clock()
        self.start()

    def step(self) -> float:
        wait = super().step()
        self.last_round = self._clock()
        return wait

    def overdue(self) -> str | None:
        """Why /healthz fails: the heartbeat is stuck, no round having ended (renewed
        or failed) for `stuck_seconds` while attempts are held (None otherwise).
        A database that cannot be reached fails no round's ending: it is for
        /readyz, and a restart would throw away the outcomes the worker holds."""
        since = self._clock() - self.last_round
        if len(self.attempts) and since >= self.stuck_seconds:
            return (
                f"heartbeat stuck: no round ended for {since:.0f}s (each ends within"
                f" {self.stuck_seconds:g}s of the last) while {len(self.attempts)}"
                " attempts are held"
            )
        return None

    def run_once(self) -> None:
        """Renew every held lease once; hand what was found to the event loop."""
        records = self.attempts.snapshot()
        keys = {record.key for record in records}
        if not keys:
            return
        leases, unknown = self._extend(keys)
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
                self.loop.call_soon_threadsafe(self.attempts.renewed, records, leases, unknown)

    def _extend(self, keys: set[Key]) -> tuple[list[Lease], set[Key]]:
        """Extend `keys` in one statement, else one key per statement (see above)."""
        try:
            return self._extend_some(keys), set()
        except DatabaseError as exc:
            log.error("heartbeat refused (%s); renewing the leases one at a time", one_line(exc))
        leases: list[Lease] = []
        unknown: set[Key] = set()
        for key in sorted(keys):
            try:
                leases.extend(self._extend_some({key}))
            except DatabaseError as exc:
                log.error("job %s attempt %s: heartbeat refused (%s)", *key, one_line(exc))
                unknown.add(key)
        return leases, unknown

    def _extend_some(self, keys: set[Key]) -> list[Lease]:
        conn = self.connection()
        with self._watch(conn):
            return claims.extend_leases(conn, self.worker_id, keys, self.attempts.lease_seconds)
