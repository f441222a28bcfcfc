"""The peers Rota is measured against: pgqueuer (asyncpg) and procrastinate (psycopg).

pgqueuer is measured twice: on the standard asyncio event loop, and on uvloop,
which its own command line (`pgq run`) uses whenever uvloop is installed: its
fastest setup, the one to beat.

Each gets the same treatment as Rota: its own fresh database on the same
server, its schema installed the way its documentation says, no-op async
handlers, jobs enqueued in advance, and worker processes timed from outside.
Also the entry point of their worker processes:

    python -m bench.peers pgqueuer DSN --batch-size 100 [--uvloop]
    python -m bench.peers procrastinate DSN --concurrency 10
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.measure import (
    Drain,
    Latency,
    enqueue_costed,
    record_start,
    spawn,
    timed_drain,
    timed_latency,
)
from bench.server import Server

NewDatabase = Callable[[str], str]
BATCH = 1000


def available() -> dict[str, bool]:
    """Which peers are installed (they are bench extras, not Rota's dependencies;
    Graphile Worker is an npm package that `make bench` installs under
    bench/graphile when node and npm are on the PATH)."""
    found = {}
    for name in ("pgqueuer", "procrastinate", "uvloop"):
        try:
            __import__(name)
            found[name] = True
        except ImportError:
            found[name] = False
    found["pgqueuer-uvloop"] = found["pgqueuer"] and found.pop("uvloop")
    graphile = graphile_installed()
    for name in GRAPHILE_SETUPS:
        found[name] = graphile
    return found


GRAPHILE_DIR = Path(__file__).resolve().parent / "graphile"
GRAPHILE_SETUPS = ("graphile-worker", "graphile-worker-c10")
"""Graphile Worker with its perfTest's settings (24 jobs at once per process), and
with the concurrency of 10 that the issue measured it at."""


def graphile_installed() -> bool:
    return (
        shutil.which("node") is not None
        and (GRAPHILE_DIR / "node_modules" / "graphile-worker" / "package.json").exists()
    )


def graphile_version() -> str:
    found = json.loads(
        (GRAPHILE_DIR / "node_modules" / "graphile-worker" / "package.json").read_text()
    )
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    return f"{found['version']} on Node {node.stdout.strip().lstrip('v')}"


class Peer:
    """One peer queue: install, enqueue, start workers, count what is left."""

    name: str
    remaining_sql: str
    any_left_sql: str

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def worker_command(self) -> list[str]:
        raise NotImplementedError

    def spawn_worker(self) -> subprocess.Popen[bytes]:
        return spawn(["-m", "bench.peers", *self.worker_command()])

    def settings(self) -> str:
        raise NotImplementedError

    async def install(self) -> None:
        raise NotImplementedError

    async def open(self) -> None:
        """Connect for enqueueing."""

    async def close(self) -> None:
        """Disconnect after enqueueing."""

    async def enqueue(self, payloads: list[dict[str, Any]], one_by_one: bool) -> None:
        raise NotImplementedError

    def enqueue_rate(self, jobs: int, one_by_one: bool, batch: int = BATCH) -> float:
        """Jobs per second, one job per call or `batch` jobs per call."""
        chunks = [
            [{"i": i} for i in range(start, min(start + batch, jobs))]
            for start in range(0, jobs, batch)
        ]

        async def send() -> float:
            await self.open()
            try:
                began = time.perf_counter()
                for chunk in chunks:
                    await self.enqueue(chunk, one_by_one)
                return jobs / (time.perf_counter() - began)
            finally:
                await self.close()

        return asyncio.run(send())

    async def enqueue_latency_job(self, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    def latency(self, jobs: int, gap: float) -> Latency:
        """Enqueue-to-start delays of jobs sent one at a time to one idle worker."""
        asyncio.run(self.install())
        loop = asyncio.new_event_loop()
        loop.run_until_complete(self.open())
        try:
            return timed_latency(
                lambda: [self.spawn_worker()],
                lambda payload: loop.run_until_complete(self.enqueue_latency_job(payload)),
                jobs,
                gap,
                f"1 worker, {self.settings()}",
            )
        finally:
            loop.run_until_complete(self.close())
            loop.close()

    def drain(self, jobs: int, processes: int, server: Server | None = None) -> Drain:
        asyncio.run(self.install())
        cpu, wal = enqueue_costed(
            server, self.dsn, lambda: self.enqueue_rate(jobs, one_by_one=False)
        )
        drained = timed_drain(
            self.dsn,
            (self.remaining_sql, self.any_left_sql),
            jobs,
            lambda: [self.spawn_worker() for _ in range(processes)],
            self.settings(),
            server,
        )
        return dataclasses.replace(drained, enqueue_cpu_seconds=cpu, enqueue_wal_bytes=wal)


class PgQueuer(Peer):
    name = "pgqueuer"
    remaining_sql = "SELECT count(*) FROM pgqueuer"
    any_left_sql = "SELECT EXISTS (SELECT FROM pgqueuer)"

    def __init__(self, dsn: str, batch_size: int = 100) -> None:
        super().__init__(dsn)
        self.batch_size = batch_size

    def worker_command(self) -> list[str]:
        return ["pgqueuer", self.dsn, "--batch-size", str(self.batch_size)]

    def settings(self) -> str:
        return f"asyncpg, asyncio loop, batch size {self.batch_size}, durable tables (default)"

    async def _queries(self) -> tuple[Any, Any]:
        import asyncpg
        from pgqueuer import Queries

        conn = await asyncpg.connect(self.dsn)
        return conn, Queries.from_asyncpg_connection(conn)

    async def install(self) -> None:
        conn, queries = await self._queries()
        try:
            await queries.install()
        finally:
            await conn.close()

    async def open(self) -> None:
        self._conn, self._queries_ = await self._queries()

    async def close(self) -> None:
        await self._conn.close()

    async def enqueue_latency_job(self, payload: dict[str, Any]) -> None:
        await self._queries_.enqueue("latency", json.dumps(payload).encode())

    async def enqueue(self, payloads: list[dict[str, Any]], one_by_one: bool) -> None:
        encoded = [json.dumps(p).encode() for p in payloads]
        if one_by_one:
            for payload in encoded:
                await self._queries_.enqueue("noop", payload)
        else:
            await self._queries_.enqueue(["noop"] * len(encoded), encoded, [0] * len(encoded))


class PgQueuerUvloop(PgQueuer):
    name = "pgqueuer-uvloop"

    def worker_command(self) -> list[str]:
        return [*super().worker_command(), "--uvloop"]

    def settings(self) -> str:
        return f"asyncpg, uvloop, batch size {self.batch_size}, durable tables (default)"


class Procrastinate(Peer):
    name = "procrastinate"
    remaining_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    any_left_sql = (
        "SELECT EXISTS (SELECT FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    )

    def __init__(self, dsn: str, concurrency: int = 10) -> None:
        super().__init__(dsn)
        self.concurrency = concurrency

    def worker_command(self) -> list[str]:
        return ["procrastinate", self.dsn, "--concurrency", str(self.concurrency)]

    def settings(self) -> str:
        return f"psycopg pool, concurrency {self.concurrency} per process"

    async def install(self) -> None:
        app = procrastinate_app(self.dsn, 2)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def open(self) -> None:
        self._app = procrastinate_app(self.dsn, 2)
        await self._app.open_async()

    async def close(self) -> None:
        await self._app.close_async()

    async def enqueue_latency_job(self, payload: dict[str, Any]) -> None:
        await self._app.tasks["latency"].defer_async(**payload)

    async def enqueue(self, payloads: list[dict[str, Any]], one_by_one: bool) -> None:
        task = self._app.tasks["noop"]
        if one_by_one:
            for payload in payloads:
                await task.defer_async(**payload)
        else:
            await task.batch_defer_async(*payloads)


class GraphileWorker(Peer):
    """Graphile Worker (Node.js): one `node bench/graphile/worker.js run` per process.

    Its jobs are enqueued the way its documentation gives for SQL, through its
    `add_job` and `add_jobs` functions; its schema is installed by its own
    `runMigrations`. It deletes a job when it completes: its jobs table holds
    only the jobs not yet done, and no history of them is kept.
    """

    name = "graphile-worker"
    remaining_sql = "SELECT count(*) FROM graphile_worker._private_jobs"
    any_left_sql = "SELECT EXISTS (SELECT FROM graphile_worker._private_jobs)"

    def __init__(self, dsn: str, concurrency: int = 24, local_queue: int = 500) -> None:
        super().__init__(dsn)
        self.concurrency = concurrency
        self.local_queue = local_queue

    def spawn_worker(self) -> subprocess.Popen[bytes]:
        return spawn(
            [
                str(GRAPHILE_DIR / "worker.js"),
                "run",
                self.dsn,
                str(self.concurrency),
                str(self.local_queue),
            ],
            program="node",
        )

    def settings(self) -> str:
        return (
            f"graphile-worker {graphile_version()}, concurrency {self.concurrency}, "
            f"pool {self.concurrency + 1}, localQueue.size {self.local_queue} "
            "(refetchDelay 10 ms), completeJobBatchDelay 0, failJobBatchDelay 0; "
            "a job deleted when done, no history"
        )

    async def install(self) -> None:
        done = await asyncio.create_subprocess_exec(
            "node", str(GRAPHILE_DIR / "worker.js"), "migrate", self.dsn,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await done.communicate()
        if done.returncode:
            raise RuntimeError(f"graphile-worker migrate failed: {err.decode()[-2000:]}")

    async def open(self) -> None:
        import psycopg

        self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)

    async def close(self) -> None:
        await self._conn.close()

    async def enqueue_latency_job(self, payload: dict[str, Any]) -> None:
        await self._conn.execute(
            b"SELECT graphile_worker.add_job('latency', %s::json)", (json.dumps(payload),)
        )

    async def enqueue(self, payloads: list[dict[str, Any]], one_by_one: bool) -> None:
        encoded = [json.dumps(p) for p in payloads]
        if one_by_one:
            for payload in encoded:
                await self._conn.execute(
                    b"SELECT graphile_worker.add_job('noop', %s::json)", (payload,)
                )
        else:
            # add_jobs takes an array of job_spec (identifier, payload, queue_name,
            # run_at, max_attempts, job_key, priority, flags).
            await self._conn.execute(
                b"SELECT FROM graphile_worker.add_jobs(ARRAY("
                b"SELECT ROW('noop', p, NULL, NULL, NULL, NULL, NULL, NULL)"
                b"::graphile_worker.job_spec FROM unnest(%s::json[]) AS p))",
                (encoded,),
            )


class GraphileWorkerC10(GraphileWorker):
    name = "graphile-worker-c10"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, concurrency=10, local_queue=500)


def procrastinate_app(dsn: str, pool_size: int) -> Any:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=dsn, min_size=1, max_size=max(2, pool_size)
        )
    )

    @app.task(name="noop")
    async def noop(i: int = 0) -> None:
        """Does nothing."""

    @app.task(name="latency")
    async def latency(t: float, path: str) -> None:
        record_start(path, t)

    return app


# -- worker processes ---------------------------------------------------------
async def pgqueuer_worker(dsn: str, batch_size: int) -> None:
    import asyncpg
    from pgqueuer import Job, Queries, QueueManager

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Does nothing."""

    @qm.entrypoint("latency")
    async def latency(job: Job) -> None:
        payload = json.loads(job.payload or b"{}")
        record_start(payload["path"], payload["t"])

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    await qm.run(batch_size=batch_size)
    await conn.close()


async def procrastinate_worker(dsn: str, concurrency: int) -> None:
    app = procrastinate_app(dsn, concurrency + 2)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, install_signal_handlers=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("peer", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("dsn")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    args = parser.parse_args()
    run: Coroutine[Any, Any, None]
    if args.peer == "pgqueuer":
        run = pgqueuer_worker(args.dsn, args.batch_size)
    else:
        run = procrastinate_worker(args.dsn, args.concurrency)
    if args.uvloop:
        import uvloop

        uvloop.run(run)
    else:
        asyncio.run(run)


if __name__ == "__main__":
    main()
