"""LISTEN for wake-ups: new jobs that can run now (channel rota_jobs).

A loop of its own (`rota_worker.loops`), on a connection of its own: each round
waits up to a second for notifications and turns them into a threading event
set for the claim loop, whose idle claim waits for it in an I/O thread. Every
`CHECK_SECONDS` it asks its connection for an answer: a connection the network
silently stopped carrying brings no notification and no error, only the end of
the answer deadline (it is then replaced). Notifications are an optimisation
only: the worker polls anyway, so a lost one delays, never loses.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from rota import db, sql
from rota_worker.loops import Loop

CHECK_SECONDS = 10.0
"""How often the listener asks its connection for an answer."""

WAIT_SECONDS = 1.0
"""The longest wait of one round for notifications."""


class Listener(Loop):
    name = "rota-listener"

    def __init__(
        self,
        dsn: str,
        wake: threading.Event,
        connect: Callable[[], db.Conn] | None = None,
        watch: Callable[[db.Conn], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        connect = connect or (lambda: db.connect(dsn, application_name="rota-worker-listen"))
        super().__init__(0.0, connect, reconnect_max_seconds=5.0)
        self.wake = wake
        self._watch = watch or (lambda conn: contextlib.nullcontext())
        self._check_at = 0.0

    def connected(self, conn: db.Conn) -> None:
        with db.errors_wrapped():
            conn.execute(sql.query("listen_jobs"))
        # After (re)connecting, wake the claim loop: notifications may have been missed.
        self.wake.set()
        self._check_at = time.monotonic() + CHECK_SECONDS

    def run_once(self) -> None:
        conn = self.connection()
        with db.errors_wrapped():
            for _ in conn.notifies(timeout=WAIT_SECONDS):
                self.wake.set()
        if time.monotonic() >= self._check_at:
            with self._watch(conn), db.errors_wrapped():
                conn.execute(sql.query("ping"))
            self._check_at = time.monotonic() + CHECK_SECONDS
