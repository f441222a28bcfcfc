"""Heartbeats that nothing in a handler can stop, and timeouts on every connection:
an async handler blocking the event loop, a lease row locked by someone else, a
heartbeat that keeps failing (/healthz), and a connection the network silently
stopped carrying (a TCP proxy started here that stops forwarding)."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

import rota
from rota import claim as claims
from rota.deadlines import Deadlines
from rota.handlers import Handler
from rota.jobs import Job
from rota.settings import ConnectionSettings
from rota_worker import listener as listener_module
from rota_worker.execute import Execution
from rota_worker.heartbeat import Heartbeat
from rota_worker.leases import LeaseKeeper
from rota_worker.listener import Listener
from tests.acceptance.procs import wait_for
from tests.worker.test_parts import _async_handlers, _noop, _running, row


def test_an_async_handler_blocking_the_loop_costs_no_neighbour_its_lease(conn, db_url) -> None:
    # time.sleep in an async def stops the event loop for longer than a lease. The
    # heartbeats come from their own thread: the sync job beside it keeps its lease,
    # and the stall is counted.
    gate = threading.Event()
    blocked = threading.Event()

    def steady(job: Job) -> None:
        gate.wait(60)

    async def blocker(job: Job) -> None:
        blocked.set()
        time.sleep(5)

    handlers = {
        **_async_handlers(blocker=blocker),
        "steady": Handler("steady", steady, is_async=False, wants_context=False),
    }
    expired = "SELECT locked_until < now() AS expired FROM rota.job WHERE id = %s"
    try:
        with _running(db_url, handlers, concurrency=2, lease_seconds=3) as worker:
            job_id = rota.enqueue(conn, "steady")
            wait_for(lambda: row(conn, job_id)["status"] == "running", 20, "the sync job to run")
            rota.enqueue(conn, "blocker")
            wait_for(blocked.is_set, 20, "the loop to be blocked")
            started = time.monotonic()
            while time.monotonic() - started < 5:  # the whole blocking sleep, and more
                assert not conn.execute(expired, (job_id,)).fetchone()["expired"]
                time.sleep(0.1)
            wait_for(lambda: worker.heartbeat.stalls >= 1, 20, "the stall to be counted")
            gate.set()
            wait_for(lambda: row(conn, job_id)["status"] == "done", 20, "the sync job's outcome")
    finally:
        gate.set()
    assert row(conn, job_id)["attempts"] == 1


def _held(keeper: LeaseKeeper, job: Job) -> Execution:
    execution = Execution(job)
    keeper.hold(execution)
    return execution


def test_a_lease_row_locked_by_someone_holds_back_no_other_lease(conn, db_url) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("t"), rota.NewJob("t")])
    jobs = claims.claim(conn, "w", 2, 30)
    keeper = LeaseKeeper("w", lease_seconds=600)
    for job in jobs:
        _held(keeper, job)
    deadlines = Deadlines(ConnectionSettings(lock_timeout_seconds=0.2))
    heartbeat = Heartbeat(db_url, keeper, deadlines, loop_stall_seconds=1)
    with psycopg.connect(db_url) as other:  # a transaction holding the first row's lock
        other.execute("SELECT * FROM rota.job WHERE id = %s FOR UPDATE", (ids[0],))
        leases, unknown = heartbeat._extend({(j.id, j.attempts) for j in jobs})
        other.rollback()
    heartbeat.stop()
    assert [lease.job_id for lease in leases] == [ids[1]]
    assert unknown == {(ids[0], 1)}  # not renewed this time, and not taken for lost
    assert row(conn, ids[1])["locked_until"] > row(conn, ids[0])["locked_until"]


def test_healthz_fails_when_no_heartbeat_succeeded_for_a_lease(conn, db_url) -> None:
    rota.enqueue(conn, "t")
    (job,) = claims.claim(conn, "w", 1, 30)
    keeper = LeaseKeeper("w", lease_seconds=30)
    refused = make_conninfo(db_url, port=_closed_port())
    heartbeat = Heartbeat(refused, keeper, Deadlines(), loop_stall_seconds=1)
    heartbeat.beat()  # nothing held: nothing to renew, all is well
    assert heartbeat.overdue() is None
    _held(keeper, job)
    heartbeat.last_ok -= 29
    heartbeat.beat()  # the database refuses connections: no heartbeat succeeds
    assert heartbeat.overdue() is None  # not a whole lease yet
    heartbeat.last_ok -= 1
    assert "no heartbeat succeeded for 30s" in (heartbeat.overdue() or "")
    real = Heartbeat(db_url, keeper, Deadlines(), loop_stall_seconds=1)
    real.beat()
    assert real.overdue() is None
    real.stop()


def test_a_stall_of_the_event_loop_is_counted_once(db_url) -> None:
    heartbeat = Heartbeat(db_url, LeaseKeeper("w", 30), Deadlines(), loop_stall_seconds=1)
    now = heartbeat.loop_tick
    assert not heartbeat.watch_loop(now + 0.5)
    assert heartbeat.watch_loop(now + 1.5) and heartbeat.watch_loop(now + 2.5)
    assert heartbeat.stalls == 1
    heartbeat.loop_tick = now + 3
    assert not heartbeat.watch_loop(now + 3.1)
    assert heartbeat.watch_loop(now + 4.5) and heartbeat.stalls == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proxy:
    """A TCP proxy to PostgreSQL that can stop forwarding the connections it carries,
    silently: their sockets stay open, nothing more goes through. Connections made
    afterwards are carried as usual."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self._frozen: set[int] = set()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._generation = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        """Stop forwarding every connection open now."""
        with self._lock:
            self._frozen.add(self._generation)
            self._generation += 1

    def close(self) -> None:
        self._closed = True
        self.server.close()
        with self._lock:
            for a, b in self._pairs:
                a.close()
                b.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                generation = self._generation
                self._pairs.append((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst, generation), daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, generation: int) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if generation in self._frozen:
                    while not self._closed:  # swallow it, answer nothing, keep the socket
                        time.sleep(0.05)
                    return
                dst.sendall(data)


@contextlib.contextmanager
def _proxy(db_url: str) -> Iterator[tuple[Proxy, str]]:
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    proxy = Proxy((str(info["host"]), int(info["port"])))
    try:
        yield proxy, make_conninfo(db_url, host="127.0.0.1", port=proxy.port)
    finally:
        proxy.close()


def test_a_connection_that_stops_answering_is_replaced_and_draining_goes_on(conn, db_url) -> None:
    # After a failover, say, the worker's connections are half-open: the network
    # carries nothing more, and no error ever comes. Each call has an answer
    # deadline: the worker takes such a connection for dead, opens a new one and
    # goes on draining.
    timeouts = ConnectionSettings(answer_timeout_seconds=2, statement_timeout_seconds=1)
    done = "SELECT count(*) AS n FROM rota.job WHERE status = 'done'"
    with (
        _proxy(db_url) as (proxy, through),
        _running(
            through, _async_handlers(noop=_noop), concurrency=2, connection=timeouts,
            reconnect_max_seconds=0.5,
        ) as worker,
    ):  # fmt: skip
        rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(20)])
        wait_for(lambda: conn.execute(done).fetchone()["n"] == 20, 30, "the first jobs")
        proxy.freeze()
        rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(20)])
        wait_for(lambda: conn.execute(done).fetchone()["n"] == 40, 60, "the next jobs")
        assert worker.deadlines.severed >= 1
    counts: Any = conn.execute("SELECT max(attempts) AS most FROM rota.job").fetchone()
    assert counts["most"] == 1


def test_every_worker_connection_carries_its_timeouts(db_url) -> None:
    timeouts = ConnectionSettings(statement_timeout_seconds=7, lock_timeout_seconds=0.5)
    deadlines = Deadlines(timeouts)
    with contextlib.closing(deadlines.connect(db_url, "claim")) as plain:
        assert plain.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "7s"}
        assert plain.execute("SHOW lock_timeout").fetchone() == {"lock_timeout": "0"}
        assert plain.info.get_parameters()  # connected
        assert "keepalives_idle=10" in plain.info.dsn
        assert "tcp_user_timeout=20000" in plain.info.dsn
    with contextlib.closing(deadlines.connect(db_url, "heartbeat", lock_timeout=True)) as beat:
        assert beat.execute("SHOW lock_timeout").fetchone() == {"lock_timeout": "500ms"}


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
