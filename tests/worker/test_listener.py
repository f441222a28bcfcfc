"""The listener: a connection that stops answering is replaced, and it listens again."""

from __future__ import annotations

import functools
import threading

import psycopg

import rota
from rota.deadlines import Deadlines
from rota.settings import ConnectionSettings
from rota_worker import listener as listener_module
from rota_worker.listener import Listener
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _proxy


def test_a_listener_whose_connection_stops_answering_reconnects(db_url, monkeypatch) -> None:
    # Its connection carries nothing more: no notification, no error. Its periodic
    # check meets the answer deadline, and it listens again on a new connection
    # (after which it wakes the claim loop: notifications may have been missed).
    monkeypatch.setattr(listener_module, "CHECK_SECONDS", 0.2)
    deadlines = Deadlines(ConnectionSettings(answer_timeout_seconds=1))
    wake = threading.Event()
    with _proxy(db_url) as (proxy, through):
        listener = Listener(
            through, wake, functools.partial(deadlines.connect, through, "listen"), deadlines.watch
        )
        listener.start()
        try:
            wait_for(wake.is_set, 20, "the listener to listen")
            wake.clear()
            proxy.freeze()
            wait_for(lambda: deadlines.severed >= 1, 20, "the dead connection to be noticed")
            wait_for(wake.is_set, 20, "the listener to listen again")
            wake.clear()
            with psycopg.connect(db_url, autocommit=True) as other:
                rota.enqueue(other, "t")  # its NOTIFY reaches the new connection
            wait_for(wake.is_set, 20, "a notification on the new connection")
        finally:
            listener.stop()
            listener.join(timeout=10)
