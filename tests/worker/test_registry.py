"""The worker's row in rota.worker (`rota_worker.registry.Registry`, a loop
stepped here without its thread): registered, refreshed by each round, an outage
backed off and survived on a new connection, taken out at stop, and a worker
that runs registers itself and is gone once stopped."""

from __future__ import annotations

import functools
import threading
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

import rota
from rota import workers
from rota.deadlines import Deadlines
from rota.handlers import Handler
from rota_worker.registry import Registry
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.worker.test_leases import _closed_port

NOTHING = Handler("t", lambda job: None, is_async=False, wants_context=False)
INFO = workers.WorkerInfo("reg-1", 2, ("t",))


def _registry(url: str) -> Registry:
    d = Deadlines()
    connect = functools.partial(d.connect, url, "rota-worker-registry")
    return Registry(INFO, 10.0, connect, d.watch, reconnect_max_seconds=4.0)


def _seen(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT seen_at FROM rota.worker WHERE id = %s", (INFO.id,)).fetchone()
    return None if row is None else row["seen_at"]  # type: ignore[call-overload]


def test_the_row_is_registered_refreshed_by_each_round_and_taken_out(conn, db_url) -> None:
    registry = _registry(db_url)
    registry.register()
    first = _seen(conn)
    assert first is not None
    assert registry.step() == 10.0
    assert _seen(conn) > first
    registry.deregister()
    assert _seen(conn) is None


def test_an_outage_is_backed_off_and_the_next_round_reconnects(conn, db_url) -> None:
    down = _registry(make_conninfo(db_url, port=_closed_port()))
    down.register()  # logged, never fatal
    assert [down.step(), down.step()] == [0.1, 0.2]
    assert down.rounds == 0
    registry = _registry(db_url)
    registry.backoff = down.backoff
    assert registry.step() == 10.0  # the database is back: the backoff starts again
    assert registry.backoff.next() == 0.1
    assert _seen(conn) is not None
    registry.close()


def test_a_running_worker_is_in_the_registry_until_it_stops(conn, db_url) -> None:
    rota.enqueue(conn, "t")
    settings = WorkerSettings(worker_id="reg-2", lease_seconds=1.5)  # refreshed every 0.5 s
    worker = Worker(db_url, settings, handlers={"t": NOTHING}, services=[])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    seen = "SELECT seen_at FROM rota.worker WHERE id = 'reg-2'"
    wait_for(lambda: conn.execute(seen).fetchone() is not None, 20, "the worker's row")
    (before,) = conn.execute(seen).fetchone().values()  # type: ignore[union-attr]
    wait_for(lambda: worker.registry.rounds >= 2, 20, "two refreshes")
    (after,) = conn.execute(seen).fetchone().values()  # type: ignore[union-attr]
    assert after > before
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert conn.execute(seen).fetchone() is None


def test_a_registered_worker_counts_as_alive_before_its_first_refresh(conn, db_url) -> None:
    # The connection that took the presence lock at registration was closed,
    # and the lock with it: a new worker counted as gone until its first
    # refresh (lease / 3 later) in `rota status` and rota_workers.
    registry = _registry(db_url)
    registry.register()
    try:
        assert [w.id for w in workers.live(conn)] == [INFO.id]
        assert registry.step() == 10.0  # the loop's rounds go on on that connection
        assert [w.id for w in workers.live(conn)] == [INFO.id]
    finally:
        registry.deregister()
        registry.close()
    assert workers.live(conn) == []
