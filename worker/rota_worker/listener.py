"""LISTEN for wake-ups: new jobs that can run now (channel rota_jobs).

Runs in a thread of its own with a dedicated connection, and turns each
notification into a threading event set for the claim loop, whose idle claim
waits for it in an I/O thread. Notifications are an optimisation only: the
worker polls anyway, so a lost one delays, never loses.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from rota import db, sql

log = logging.getLogger("rota.worker")

CHECK_SECONDS = 10.0
"""How often the listener asks its connection for an answer: a connection the
network silently stopped carrying brings no notification and no error, only
the end of the answer deadline (it is then replaced)."""


class Listener(threading.Thread):
    def __init__(
        self,
        dsn: str,
        wake: threading.Event,
        connect: Callable[[], db.Conn] | None = None,
        watch: Callable[[db.Conn], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        super().__init__(name="rota-listener", daemon=True)
        self.dsn = dsn
        self.wake = wake
        self._watch = watch or (lambda conn: contextlib.nullcontext())
        """Bounds the wait for the answer to the listener's check (see `_check`)."""
        self._connect = connect or (
            lambda: db.connect(self.dsn, application_name="rota-worker-listen")
        )
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            try:
                self._listen()
                delay = 0.1
            except Exception as exc:  # the listener must outlive any outage
                if self._stopping.is_set():
                    return
                log.debug("listener: %s; reconnecting in %.1fs", exc, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)

    def _listen(self) -> None:
        conn = self._connect()
        try:
            conn.execute(sql.query("listen_jobs"))
            # After (re)connecting, wake the claim loop: notifications may have been missed.
            self.wake.set()
            check_at = time.monotonic() + CHECK_SECONDS
            while not self._stopping.is_set():
                for _ in conn.notifies(timeout=1.0):
                    self.wake.set()
                if time.monotonic() >= check_at:
                    self._check(conn)
                    check_at = time.monotonic() + CHECK_SECONDS
        finally:
            conn.close()

    def _check(self, conn: db.Conn) -> None:
        with self._watch(conn), db.errors_wrapped():
            conn.execute(sql.query("ping"))
