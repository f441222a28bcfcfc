"""The answer deadline: how long Rota's own processes wait for PostgreSQL to answer.

A connection the network silently stopped carrying (a half-open socket after a
failover, a proxy that stopped forwarding) answers nothing, and no error ever
comes on it: the keepalives are answered by whatever holds the other end, the
server never sees the statement, so its statement timeout never fires either.
`Deadlines` keeps one watchdog thread that shuts down the socket of a
connection that has had no answer for `answer_timeout_seconds`: the wait ends
with an outage (`DatabaseUnavailable`), and its owner opens a new connection.

The worker bounds each of its calls (`Deadlines.watch`); the services (the
reaper and the scheduler, alone or inside a worker, and `rota archive`) open their
connection with ``each_answer=True``, which bounds every round trip to the
server on it, so a pass of many statements is never cut short for its length,
only for a silence. Nothing here is used on connections handlers open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from rota import db
from rota.settings import ConnectionSettings

log = logging.getLogger("rota.deadlines")


class Deadlines:
    """The timeouts of Rota's own connections: how each is opened (connect timeout,
    keepalives, TCP_USER_TIMEOUT, statement timeout, see `ConnectionSettings`), and
    the answer deadline, kept by one watchdog thread."""

    def __init__(self, settings: ConnectionSettings | None = None) -> None:
        self.settings = settings or ConnectionSettings()
        self.answer_seconds = self.settings.answer_timeout_seconds
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[db.Conn, float]] = {}
        self._watchdog: threading.Thread | None = None
        self.severed = 0
        """Connections shut down for want of an answer (for tests and logs)."""

    def connect(
        self,
        dsn: str,
        application_name: str,
        *,
        lock_timeout: bool = False,
        each_answer: bool = False,
    ) -> db.Conn:
        """A connection with the timeouts; with `each_answer`, every round trip on it
        must be answered within the deadline (otherwise its owner uses `watch`)."""
        options = self.settings.libpq(dsn, lock_timeout=lock_timeout)
        if not each_answer:
            return db.connect(dsn, application_name=application_name, **options)
        conn = db.connect(
            dsn, connection_class=_AnswerBound, application_name=application_name, **options
        )
        assert isinstance(conn, _AnswerBound)
        conn.deadlines = self
        return conn

    @contextlib.contextmanager
    def watch(self, conn: db.Conn, extra_seconds: float = 0.0) -> Iterator[None]:
        """Within the block, `conn` must answer within the deadline (plus `extra_seconds`)."""
        token = id(conn)
        with self._lock:
            self._calls[token] = (conn, time.monotonic() + self.answer_seconds + extra_seconds)
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name="rota-deadlines", daemon=True
                )
                self._watchdog.start()
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(token, None)

    def _watch(self) -> None:
        tick = min(0.25, self.answer_seconds / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self._lock:
                late = [(t, c) for t, (c, due) in self._calls.items() if now >= due]
                for token, _ in late:
                    del self._calls[token]
            for _, conn in late:
                self.severed += 1
                log.warning(
                    "no answer on a connection (%s) for %.0fs; taking it for dead",
                    _name(conn),
                    self.answer_seconds,
                )
                sever(conn)


class _AnswerBound(psycopg.Connection[Any]):
    """A connection whose every wait for the server (a statement, a commit, a chunk
    of waiting for notifications) is bounded by the answer deadline of its
    `Deadlines`. `wait` is where psycopg's blocking calls all wait for the socket."""

    deadlines: Deadlines | None = None

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if self.deadlines is None:
            return super().wait(*args, **kwargs)
        with self.deadlines.watch(self):
            return super().wait(*args, **kwargs)


def sever(conn: db.Conn) -> None:
    """Shut the connection's socket down under whoever waits on it: their wait ends
    with an error (an outage), and the next call opens a new connection."""
    with contextlib.suppress(Exception):
        dup = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


def _name(conn: db.Conn) -> str:
    with contextlib.suppress(Exception):
        return str(conn.info.get_parameters().get("application_name") or "rota")
    return "rota"
