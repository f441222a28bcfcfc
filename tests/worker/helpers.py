"""What the worker's tests share: a worker in a thread of the test process, async
handlers, a job's row, and a TCP proxy that can stop forwarding silently."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from rota.handlers import Handler
from rota.jobs import Job
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker


def row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    found = conn.execute("SELECT * FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return dict(found)


def _async_handlers(**funcs: Callable[[Job], Awaitable[None]]) -> dict[str, Handler]:
    return {name: Handler(name, f, is_async=True, wants_context=False) for name, f in funcs.items()}


@contextlib.contextmanager
def _running(
    db_url: str, handlers: dict[str, Handler], concurrency: int, **settings_: Any
) -> Iterator[Worker]:
    """A worker of `handlers` in a thread of this process (no reaper, no scheduler
    unless `settings_` say so), stopped at the end (and joined within 30 s)."""
    defaults = {"poll_interval_seconds": 0.2, "run_reaper": False, "run_scheduler": False}
    settings = WorkerSettings(concurrency=concurrency, **{**defaults, **settings_})
    worker = Worker(db_url, settings, handlers=handlers)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        yield worker
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


async def _noop(job: Job) -> None:
    return None


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
