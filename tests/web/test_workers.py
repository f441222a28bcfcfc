"""rota.worker: workers register, refresh and deregister; dead rows expire; the
live count reaches `rota status` and the rota_workers gauge."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
from prometheus_client import generate_latest

from rota import workers
from rota.metrics import queue_registry
from rota.status import read_status, render
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker

T0 = datetime(2030, 3, 14, 12, 0, tzinfo=UTC)


def test_register_refresh_expire_and_deregister(conn):
    a = workers.WorkerInfo("a", concurrency=2, types=("email",))
    b = workers.WorkerInfo("b", concurrency=1)
    workers.register(conn, a, ttl=30, now=T0)
    workers.register(conn, b, ttl=30, now=T0)
    assert workers.live_count(conn, now=T0 + timedelta(seconds=10)) == 2
    workers.refresh(conn, a, ttl=30, now=T0 + timedelta(seconds=20))
    later = T0 + timedelta(seconds=40)
    assert [w.id for w in workers.live(conn, now=later)] == ["a"]
    assert workers.expire(conn, now=later) == ["b"]
    assert workers.deregister(conn, a) is True
    assert workers.deregister(conn, a) is False
    assert workers.live_count(conn, now=later) == 0


def test_a_refresh_brings_back_an_expired_row_and_samples_the_queue_once_a_minute(conn):
    info = workers.WorkerInfo("a", concurrency=1)
    workers.refresh(conn, info, ttl=30, now=T0)
    workers.refresh(conn, info, ttl=30, now=T0 + timedelta(seconds=20))
    workers.refresh(conn, info, ttl=30, now=T0 + timedelta(seconds=70))
    assert workers.live_count(conn, now=T0 + timedelta(seconds=80)) == 1
    minutes = [r["minute"] for r in conn.execute("SELECT minute FROM rota.queue_sample ORDER BY 1")]
    assert minutes == [T0, T0 + timedelta(minutes=1)]


def test_status_and_the_gauge_count_live_workers(conn, db_url):
    workers.register(conn, workers.WorkerInfo("a", concurrency=1))
    status = read_status(conn)
    assert status.workers == 1
    assert "Workers alive: 1" in render(status)
    assert status.to_json()["workers"] == 1
    assert "rota_workers 1.0" in generate_latest(queue_registry(db_url, cache_seconds=0)).decode()


def wait_until(check, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_running_worker_keeps_its_row_and_takes_it_out_when_it_stops(conn, db_url):
    settings = WorkerSettings(concurrency=3, lease_seconds=1.5, worker_id="w-hook", types=["t"])
    worker = Worker(db_url, settings, handlers={}, services=[])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until(lambda: workers.live_count(conn) == 1, "the worker's row")
        [row] = workers.live(conn)
        assert (row.id, row.concurrency, row.types) == ("w-hook", 3, ("t",))
        first_seen = row.seen_at
        wait_until(lambda: workers.live(conn)[0].seen_at > first_seen, "a refresh")
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert workers.live_count(conn) == 0


def test_a_killed_worker_stops_counting_at_once_not_after_its_ttl(conn, db_url):
    """Its connection ends with it, and with the connection its presence lock."""
    survivor, killed = workers.WorkerInfo("alive", 1), workers.WorkerInfo("killed", 1)
    workers.register(conn, survivor, ttl=600)
    with psycopg.connect(db_url, autocommit=True) as other:
        workers.register(other, killed, ttl=600)
        workers.refresh(other, killed, ttl=600)  # held once, however often it refreshes
        assert workers.live_count(conn) == 2
        held = "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
        pid = other.info.backend_pid
    # The server ends the session a moment after the client hangs up.
    wait_until(lambda: conn.execute(held, (pid,)).fetchone()["n"] == 0, "the session to end")
    assert conn.execute("SELECT count(*) AS n FROM rota.worker").fetchone()["n"] == 2  # row stays
    assert workers.live_count(conn) == 1
    assert [w.id for w in workers.live(conn)] == ["alive"]
    assert read_status(conn).workers == 1
