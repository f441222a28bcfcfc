"""LISTEN for wake-ups: new jobs that can run now (channel rota_jobs).

Runs in a thread of its own with a dedicated connection, and turns each
notification into a threading event set for the claim loop, whose idle claim
waits for it in an I/O thread. Notifications are an optimisation only: the
worker polls anyway, so a lost one delays, never loses.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from rota import db, sql

log = logging.getLogger("rota.worker")


class Listener(threading.Thread):
    def __init__(
        self, dsn: str, wake: threading.Event, connect: Callable[[], db.Conn] | None = None
    ) -> None:
        super().__init__(name="rota-listener", daemon=True)
        self.dsn = dsn
        self.wake = wake
        self._connect = connect or (
            lambda: db.connect(self.dsn, application_name="rota-worker-listen")
        )
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            try:
                self._listen()
                delay = 0.1
            except Exception as exc:  # the listener must outlive any outage
                if self._stop.is_set():
                    return
                log.debug("listener: %s; reconnecting in %.1fs", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def _listen(self) -> None:
        conn = self._connect()
        try:
            conn.execute(sql.query("listen_jobs"))
            # After (re)connecting, wake the claim loop: notifications may have been missed.
            self.wake.set()
            while not self._stop.is_set():
                for _ in conn.notifies(timeout=1.0):
                    self.wake.set()
        finally:
            conn.close()
