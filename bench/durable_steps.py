"""Ten-step durable jobs in Rota, DBOS and Absurd, on one PostgreSQL.

    make bench-durable                  (BENCH_DURABLE_ARGS="--jobs 300" for a short run)

Each system gets a database of its own on one embedded server, its schema
installed as its documentation says (Rota: `rota migrate`; DBOS: launched on
its system database; Absurd: `absurdctl init` and `create-queue`), and the same
job: ten steps in a row whose functions do nothing, so that what is measured is
what a step costs, its checkpoint. In rounds (3 by default, each starting with
another system), two measurements, whose medians are reported with each
round's steps per second:

- Checkpoint latency: one worker process running one job at a time; every step
  call timed inside the handler (the first step of a job includes reading what
  the job stored before, as each system does). p50 and p99 in milliseconds.
- Throughput: three worker processes (Absurd's measured setup), jobs enqueued in
  advance. Steps per second between 5 % and 100 % of the jobs done (worker
  start-up left out), and the server's CPU per step over the same window
  (bench.server: the postmaster and its children, from /proc).
- Rota alone, once: a worker killed (SIGKILL) after the third of ten slow
  steps, another started at once; how long until the job stored its fourth
  step, against its lease (5 s), and the attempts it was charged once done.

The worker processes of the peers are this module's entry points:

    python -m bench.durable_steps dbos-worker DSN OUT CONCURRENCY
    python -m bench.durable_steps absurd-worker DSN OUT CONCURRENCY

Rota's is `rota worker --handlers bench.durable_steps`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import rota
from bench.server import cpu_seconds_of

STEPS = 10
WORKERS = 3
SLOW_STEP_SECONDS = 0.2
CRASH_LEASE_SECONDS = 5.0
OUT_ENV = "BENCH_DURABLE_OUT"


def _noop() -> int:
    return 1


def _record(times: list[float]) -> None:
    """Append one job's step times (seconds) to this process's file."""
    path = os.environ.get(OUT_ENV)
    if path:
        with open(f"{path}.{os.getpid()}", "a") as out:
            out.write(" ".join(f"{t:.9f}" for t in times) + "\n")


@rota.handler("bench.ten.steps")
def ten_steps(job: rota.Job, ctx: rota.Context) -> None:
    times = []
    for i in range(STEPS):
        began = time.perf_counter()
        ctx.step(f"s{i}", _noop)
        times.append(time.perf_counter() - began)
    _record(times)


@rota.handler("bench.slow.steps")
def slow_steps(job: rota.Job, ctx: rota.Context) -> None:
    for i in range(STEPS):
        ctx.step(f"s{i}", time.sleep, SLOW_STEP_SECONDS)


# -- the peers' workers -----------------------------------------------------------


def dbos_worker(dsn: str, out: str, concurrency: int) -> None:
    from dbos import DBOS

    os.environ[OUT_ENV] = out
    DBOS(
        config={
            "name": "bench",
            "system_database_url": _sqlalchemy_url(dsn),
            "application_version": "bench",
            "log_level": "WARNING",
        }
    )

    @DBOS.step(name="noop")
    def noop() -> int:
        return 1

    @DBOS.workflow(name="ten")
    def ten() -> None:
        times = []
        for _ in range(STEPS):
            began = time.perf_counter()
            noop()
            times.append(time.perf_counter() - began)
        _record(times)

    DBOS.launch()
    DBOS.register_queue(
        "bench",
        worker_concurrency=concurrency,
        polling_interval_sec=0.05,
        on_conflict="always_update",
    )
    Path(f"{out}.ready").touch()  # launched: the schema is migrated, the queue registered
    while True:
        time.sleep(3600)


def absurd_worker(dsn: str, out: str, concurrency: int) -> None:
    from absurd_sdk import Absurd

    os.environ[OUT_ENV] = out
    app = Absurd(dsn, queue_name="default")

    @app.register_task(name="ten")
    def ten(params: Any, ctx: Any) -> None:
        times = []
        for i in range(STEPS):
            began = time.perf_counter()
            ctx.step(f"s{i}", _noop)
            times.append(time.perf_counter() - began)
        _record(times)

    app.start_worker(concurrency=concurrency, poll_interval=0.05)


def _sqlalchemy_url(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(dsn)
    return (
        f"postgresql+psycopg://{p.get('user', 'postgres')}@{p.get('host', 'localhost')}:"
        f"{p.get('port', 5432)}/{p['dbname']}"
    )


# -- one system -------------------------------------------------------------------


class System:
    name: str
    done_sql: str
    reset_sql: tuple[str, ...]
    """What forgets the jobs of the previous measurement."""

    def __init__(self, dsn: str, bindir: Path) -> None:
        self.dsn = dsn
        self.bindir = bindir

    def install(self) -> None:
        raise NotImplementedError

    def enqueue(self, jobs: int) -> None:
        raise NotImplementedError

    def worker(self, out: str, concurrency: int) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def done(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(self.done_sql.encode()).fetchone()
        return int(row[0]) if row else 0

    def reset(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for statement in self.reset_sql:
                conn.execute(statement.encode())


def _spawn(
    argv: list[str], env: dict[str, str] | None = None, log: str = os.devnull
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT
        )


class Rota(System):
    name = "rota"
    done_sql = "SELECT count(*) FROM rota.job WHERE status = 'done'"
    reset_sql = ("DELETE FROM rota.job",)

    def install(self) -> None:
        rota.migrate(self.dsn)

    def enqueue(self, jobs: int) -> None:
        rota.enqueue_many(self.dsn, [rota.NewJob("bench.ten.steps") for _ in range(jobs)])

    def worker(self, out: str, concurrency: int, *more: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "rota", "worker", "--handlers", "bench.durable_steps"]
        argv += ["--concurrency", str(concurrency), "--no-scheduler", "--poll-interval", "0.05"]
        return _spawn([*argv, *more], {"ROTA_DATABASE_URL": self.dsn, OUT_ENV: out})


class Dbos(System):
    name = "dbos"
    done_sql = "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
    reset_sql = ("DELETE FROM dbos.workflow_status",)

    def install(self) -> None:
        # DBOS creates its system database schema on launch: one worker started
        # and stopped installs it.
        out = f"{tempfile.gettempdir()}/dbos-install-{os.getpid()}"
        worker = self.worker(out, 1)
        try:
            _wait(lambda: Path(f"{out}.ready").exists(), 120, "DBOS to launch")
        finally:
            _stop([worker])

    def enqueue(self, jobs: int) -> None:
        from dbos import DBOSClient

        client = DBOSClient(system_database_url=_sqlalchemy_url(self.dsn))
        try:
            for _ in range(jobs):
                client.enqueue(
                    {"workflow_name": "ten", "queue_name": "bench", "app_version": "bench"}
                )
        finally:
            client.destroy()

    def worker(self, out: str, concurrency: int) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "bench.durable_steps", "dbos-worker", self.dsn, out]
        return _spawn([*argv, str(concurrency)], log=f"{out}.log")


class Absurd(System):
    name = "absurd"
    done_sql = "SELECT count(*) FROM absurd.t_default WHERE state = 'completed'"
    reset_sql = ("SELECT absurd.drop_queue('default')", "SELECT absurd.create_queue('default')")

    def install(self) -> None:
        ctl = str(self.bindir / "absurdctl")
        subprocess.run([ctl, "init", "-d", _uri(self.dsn)], check=True, capture_output=True)
        subprocess.run(
            [ctl, "create-queue", "-d", _uri(self.dsn), "default"], check=True, capture_output=True
        )

    def enqueue(self, jobs: int) -> None:
        from absurd_sdk import Absurd as Client

        app = Client(self.dsn, queue_name="default")
        for _ in range(jobs):
            app.spawn("ten", {}, queue="default")
        app.close()

    def worker(self, out: str, concurrency: int) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "bench.durable_steps", "absurd-worker", self.dsn, out]
        return _spawn([*argv, str(concurrency)])


def _uri(dsn: str) -> str:
    return _sqlalchemy_url(dsn).replace("postgresql+psycopg://", "postgresql://")


def _exists(conn: psycopg.Connection[Any], table: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    return bool(row and row[0])


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for w in workers:
        if w.poll() is None:
            w.terminate()
    for w in workers:
        try:
            w.wait(30)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait(30)


def _times(out: str) -> list[float]:
    found = []
    folder, prefix = os.path.split(out)
    for entry in os.scandir(folder):
        if entry.name.startswith(prefix + "."):
            for line in Path(entry.path).read_text().splitlines():
                found += [float(t) for t in line.split()]
    return found


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- the two measurements ---------------------------------------------------------


def latency(system: System, jobs: int, tmp: str) -> dict[str, float]:
    system.reset()
    system.enqueue(jobs)
    out = tempfile.mkdtemp(dir=tmp) + f"/{system.name}-latency"  # this round's own
    worker = system.worker(out, 1)
    try:
        with psycopg.connect(system.dsn, autocommit=True) as conn:
            _wait(lambda: system.done(conn) >= jobs, 600, f"{system.name}'s latency jobs")
    finally:
        _stop([worker])
    times = [t * 1000 for t in _times(out)]
    return {
        "steps": len(times),
        "p50_ms": percentile(times, 0.50),
        "p99_ms": percentile(times, 0.99),
        "mean_ms": statistics.fmean(times),
    }


def throughput(
    system: System, jobs: int, concurrency: int, tmp: str, server: Any
) -> dict[str, float]:
    system.reset()
    system.enqueue(jobs)
    out = tempfile.mkdtemp(dir=tmp) + f"/{system.name}-throughput"
    workers = [system.worker(out, concurrency) for _ in range(WORKERS)]
    try:
        with psycopg.connect(system.dsn, autocommit=True) as conn:
            first = max(1, jobs // 20)
            _wait(lambda: system.done(conn) >= first, 600, f"{system.name}'s first jobs")
            began, cpu0, done0 = time.perf_counter(), server.read().cpu_seconds, system.done(conn)
            mine0 = cpu_seconds_of(w.pid for w in workers)
            _wait(lambda: system.done(conn) >= jobs, 900, f"{system.name}'s jobs")
            ended, cpu1 = time.perf_counter(), server.read().cpu_seconds
            mine1 = cpu_seconds_of(w.pid for w in workers)
    finally:
        _stop(workers)
    steps = (jobs - done0) * STEPS
    return {
        "steps": steps,
        "steps_per_second": steps / (ended - began),
        "server_cpu_ms_per_step": 1000 * (cpu1 - cpu0) / steps,
        "worker_cpu_ms_per_step": 1000 * (mine1 - mine0) / steps,
    }


def crash_resume(system: Rota) -> dict[str, float]:
    """Kill (SIGKILL) Rota's worker after the third of ten slow steps, start
    another one at once, and time how long the job takes to store its fourth
    step; then how many attempts it was charged once done."""
    system.reset()
    job_id = rota.enqueue(system.dsn, "bench.slow.steps")
    lease = ("--lease", f"{CRASH_LEASE_SECONDS:g}")
    steps = "SELECT count(*) FROM rota.job_step WHERE job_id = %s"
    with psycopg.connect(system.dsn, autocommit=True) as conn:

        def stored() -> int:
            row = conn.execute(steps, (job_id,)).fetchone()
            return int(row[0]) if row else 0

        first = system.worker(os.devnull, 1, *lease)
        try:
            _wait(lambda: stored() >= 3, 120, "the crash job's third step")
        finally:
            first.kill()
            first.wait(60)
        killed, before = time.perf_counter(), stored()
        second = system.worker(os.devnull, 1, *lease)
        try:
            _wait(lambda: stored() > before, 120, "the crash job's next step")
            resumed = time.perf_counter() - killed
            _wait(lambda: system.done(conn) >= 1, 120, "the crash job")
        finally:
            _stop([second])
        row = conn.execute("SELECT attempts FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    return {
        "lease_seconds": CRASH_LEASE_SECONDS,
        "resumed_after_seconds": resumed,
        "attempts": int(row[0]) if row else -1,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.server import Server
    from rota.testing import EmbeddedPostgres

    bindir = Path(sys.executable).parent
    results: dict[str, Any] = {}
    with EmbeddedPostgres(durable=True) as pg, tempfile.TemporaryDirectory() as tmp:
        server = Server(pg.data, pg.url())
        results["about"] = {
            "postgres": server.version(),
            "python": platform.python_version(),
            "cores": len(os.sched_getaffinity(0)),
            "jobs": args.jobs,
            "latency_jobs": args.latency_jobs,
            "workers": WORKERS,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
        }
        systems: list[System] = []
        for cls in (Rota, Dbos, Absurd):
            if cls.name in args.only:
                made: System = cls(pg.create_database(f"bench_{cls.name}"), bindir)
                print(f"... {cls.name}: install", file=sys.stderr, flush=True)
                made.install()
                systems.append(made)
        rounds: dict[str, list[dict[str, Any]]] = {one.name: [] for one in systems}
        for r in range(args.rounds):
            # Each round starts with another system, so none is always first.
            for one in systems[r % len(systems) :] + systems[: r % len(systems)]:
                print(f"... round {r + 1}: {one.name}", file=sys.stderr, flush=True)
                rounds[one.name].append(
                    {
                        "latency": latency(one, args.latency_jobs, tmp),
                        "throughput": throughput(one, args.jobs, args.concurrency, tmp, server),
                    }
                )
        for one in systems:
            results[one.name] = _medians(rounds[one.name])
            if isinstance(one, Rota):
                print(f"... {one.name}: a worker killed mid-job", file=sys.stderr, flush=True)
                results[one.name]["crash"] = crash_resume(one)
        results["about"]["load_average_at_end"] = list(os.getloadavg())
        server.close()
    return results


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each measure's median over the rounds, and the rounds themselves."""
    return {
        part: {key: statistics.median(r[part][key] for r in rounds) for key in rounds[0][part]}
        for part in ("latency", "throughput")
    } | {"rounds": rounds}


def report(results: dict[str, Any]) -> str:
    lines = [
        f"PostgreSQL {results['about']['postgres']}, Python {results['about']['python']},"
        f" {results['about']['cores']} cores",
        "",
        "| | step p50 ms | step p99 ms | steps/s (3 workers) | server CPU ms/step"
        " | workers' CPU ms/step |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("rota", "dbos", "absurd"):
        if name in results:
            lat, thr = results[name]["latency"], results[name]["throughput"]
            rates = [r["throughput"]["steps_per_second"] for r in results[name]["rounds"]]
            lines.append(
                f"| {name} | {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} |"
                f" {thr['steps_per_second']:.0f} ({', '.join(f'{x:.0f}' for x in rates)}) |"
                f" {thr['server_cpu_ms_per_step']:.3f} | {thr['worker_cpu_ms_per_step']:.3f} |"
            )
    about = results["about"]
    lines += ["", f"Medians of {about['rounds']} round(s), each round's steps/s in brackets."]
    return "\n".join([*lines, "", *goals(results)]) + "\n"


def goals(results: dict[str, Any]) -> list[str]:
    """Rota against the goals of its durable jobs, each within this run."""
    if "rota" not in results:
        return []
    rota_ = results["rota"]
    p50 = rota_["latency"]["p50_ms"]
    rows = [("step checkpoint p50 (ms)", f"{p50:.2f}", "<= 0.5", p50 <= 0.5)]
    if "absurd" in results:
        ratio = (
            rota_["throughput"]["steps_per_second"]
            / results["absurd"]["throughput"]["steps_per_second"]
        )
        rows.append(("steps/s over Absurd's", f"{ratio:.2f}", ">= 3", ratio >= 3))
    cpu = rota_["throughput"]["server_cpu_ms_per_step"]
    for peer in ("dbos", "absurd"):
        if peer in results:
            theirs = results[peer]["throughput"]["server_cpu_ms_per_step"]
            rows.append(
                (f"server CPU per step over {peer}'s", f"{cpu / theirs:.2f}", "< 1", cpu < theirs)
            )
    crash = rota_.get("crash")
    if crash:
        rows.append(
            (
                f"a killed worker's job resumes within one lease ({crash['lease_seconds']:g} s)",
                f"{crash['resumed_after_seconds']:.1f} s",
                f"<= {crash['lease_seconds']:g} s",
                crash["resumed_after_seconds"] <= crash["lease_seconds"],
            )
        )
        rows.append(
            (
                "attempts charged to it, once done",
                str(crash["attempts"]),
                "1",
                crash["attempts"] == 1,
            )
        )
    lines = ["| goal | Rota | target | met |", "|---|---|---|---|"]
    lines += [
        f"| {what} | {value} | {target} | {'yes' if met else 'no'} |"
        for what, value, target, met in rows
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("dbos-worker", "absurd-worker"):
        entry = dbos_worker if argv[0] == "dbos-worker" else absurd_worker
        entry(argv[1], argv[2], int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.durable_steps")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs of the throughput run")
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8, help="per worker process")
    parser.add_argument("--only", nargs="+", default=["rota", "dbos", "absurd"])
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, each system in turn (medians reported)"
    )
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    results = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(report(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
