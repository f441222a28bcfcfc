"""This worker's row in rota.worker: registered at start, refreshed, taken out at stop.

Refreshed every `registry_refresh_seconds` by a loop of its own
(`rota_worker.loops`), on a connection of its own, off the lease-critical
path (leases are renewed by `rota_worker.leases`); the refresh also writes the
queue's minute samples. A failure is logged and never fatal: an outage is
tried again after the loop's backoff, a refusal after the interval.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from rota import db, workers
from rota.errors import RotaError, one_line
from rota_worker.loops import Loop

log = logging.getLogger("rota.worker")


class Registry(Loop):
    name = "rota-registry"

    def __init__(
        self,
        info: workers.WorkerInfo,
        interval: float,
        connect: Callable[[], db.Conn],
        watch: Callable[[db.Conn], contextlib.AbstractContextManager[None]],
        reconnect_max_seconds: float = 10.0,
    ) -> None:
        super().__init__(interval, connect, min(reconnect_max_seconds, interval))
        self.info = info
        self.ttl = max(workers.DEFAULT_TTL_SECONDS, 3 * interval)
        """How long the row outlives its last refresh."""
        self._watch = watch
        self.registered = False

    def run_once(self) -> None:
        self._call(workers.refresh, self.connection())

    def register(self) -> None:
        """Write the row (before `start`, in the caller's thread) on the connection
        the loop's rounds go on with: it holds the presence lock, without which the
        worker counts as gone (`worker_presence_hold`)."""
        self._once(workers.register, keep=True)
        self.registered = True

    def deregister(self) -> None:
        """Take the row out (after `stop`)."""
        if self.registered:
            self._once(workers.deregister)

    def _once(self, call: Callable[..., object], keep: bool = False) -> None:
        """`call` outside the loop's rounds: on the loop's connection (closed after
        unless `keep`), or on one of its own if a round stuck on the network
        still holds that one."""
        try:
            if not self.is_alive():
                try:
                    self._call(call, self.connection())
                except BaseException:
                    self.close()
                    raise
                if not keep:
                    self.close()
                return
            with contextlib.closing(self._connect_once()) as conn:
                self._call(call, conn)
        except RotaError as exc:
            log.warning("worker %s: cannot update rota.worker (%s)", self.info.id, one_line(exc))

    def _connect_once(self) -> db.Conn:
        assert self._connect is not None
        return self._connect()

    def _call(self, call: Callable[..., object], conn: db.Conn) -> None:
        with self._watch(conn):
            call(conn, self.info, self.ttl)
