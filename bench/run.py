"""`make bench`: Rota, pgqueuer and procrastinate side by side on one PostgreSQL.

Starts a throwaway PostgreSQL server with its default durability (fsync and
synchronous_commit on), gives every measurement a fresh database on it, and
prints one table. The peers are measured only when they are installed (they
are the `bench` extras); `--only-rota` skips them.

    python -m bench.run [--jobs 20000] [--latency-jobs 300] [--json results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import sys
from collections.abc import Callable
from typing import Any

from bench import rota_bench
from bench.measure import Drain, Latency
from bench.peers import Peer, PgQueuer, Procrastinate, available

Row = tuple[str, Callable[[dict[str, Any]], str]]


def measure(
    new_database: Callable[[str], str],
    jobs: int,
    single_jobs: int,
    latency_jobs: int,
    gap: float,
    concurrency: int,
    peers: bool,
    say: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Every measurement, by queue name; each value is a float or a Drain/Latency."""
    results: dict[str, dict[str, Any]] = {"rota": {}}
    rota = results["rota"]
    say("rota: enqueue")
    rota["single"] = rota_bench.enqueue_single(
        rota_bench.fresh(new_database, "rota_single"), single_jobs
    )
    rota["batch"] = rota_bench.enqueue_batches(rota_bench.fresh(new_database, "rota_batch"), jobs)
    for processes in (1, 4):
        say(f"rota: drain with {processes} process(es)")
        rota[f"drain{processes}"] = rota_bench.drain(new_database, jobs, processes, concurrency)
    say("rota: enqueue-to-start latency")
    rota["latency"] = rota_bench.latency(new_database, latency_jobs, gap)
    if not peers:
        return results
    installed = available()
    peer_types: list[type[Peer]] = [PgQueuer, Procrastinate]
    for peer in peer_types:
        if not installed[peer.name]:
            say(f"{peer.name} is not installed; skipped")
            continue
        results[peer.name] = _measure_peer(
            peer, new_database, jobs, single_jobs, latency_jobs, gap, say
        )
    return results


def _measure_peer(
    peer: type[Peer],
    new_database: Callable[[str], str],
    jobs: int,
    single_jobs: int,
    latency_jobs: int,
    gap: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    import asyncio

    found: dict[str, Any] = {}
    say(f"{peer.name}: enqueue")
    single = peer(new_database(f"{peer.name}_single"))
    asyncio.run(single.install())
    found["single"] = single.enqueue_rate(single_jobs, one_by_one=True)
    batch = peer(new_database(f"{peer.name}_batch"))
    asyncio.run(batch.install())
    found["batch"] = batch.enqueue_rate(jobs, one_by_one=False)
    # procrastinate fetches and finishes one job per transaction: a smaller
    # drain tells the same story in a fraction of the time.
    drain_jobs = jobs if peer is PgQueuer else max(1, jobs // 4)
    for processes in (1, 4):
        say(f"{peer.name}: drain of {drain_jobs} with {processes} process(es)")
        found[f"drain{processes}"] = peer(new_database(f"{peer.name}_drain_{processes}")).drain(
            drain_jobs, processes
        )
    say(f"{peer.name}: enqueue-to-start latency")
    found["latency"] = peer(new_database(f"{peer.name}_latency")).latency(latency_jobs, gap)
    return found


ROWS: list[Row] = [
    ("enqueue, one per transaction (jobs/s)", lambda r: _rate(r.get("single"))),
    ("enqueue, batches of 1,000 (jobs/s)", lambda r: _rate(r.get("batch"))),
    ("drain no-op jobs, 1 process (jobs/s)", lambda r: _drain(r.get("drain1"))),
    ("drain no-op jobs, 4 processes (jobs/s)", lambda r: _drain(r.get("drain4"))),
    ("enqueue-to-start p50 (ms)", lambda r: _ms(r.get("latency"), "p50_ms")),
    ("enqueue-to-start p99 (ms)", lambda r: _ms(r.get("latency"), "p99_ms")),
]


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _drain(value: Drain | None) -> str:
    return "-" if value is None else f"{value.rate:,.0f}"


def _ms(value: Latency | None, field: str) -> str:
    return "-" if value is None else f"{getattr(value, field):.1f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """The results as a Markdown table, then how each queue was set up."""
    names = list(results)
    lines = [
        "| measure | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for label, cell in ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |")
    lines.append("")
    for name in names:
        drains = [results[name].get(f"drain{p}") for p in (1, 4)]
        done = [d for d in drains if d is not None]
        if done:
            lines.append(f"- {name} drain: {done[0].jobs:,} jobs, {done[0].settings}")
        if results[name].get("latency") is not None:
            lat = results[name]["latency"]
            lines.append(f"- {name} latency: {lat.jobs} jobs, {lat.settings}")
    return "\n".join(lines)


def _jsonable(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        name: {
            k: dataclasses.asdict(v) if isinstance(v, Drain | Latency) else v
            for k, v in found.items()
        }
        for name, found in results.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--single-jobs", type=int, default=2_000)
    parser.add_argument("--latency-jobs", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between latency jobs")
    parser.add_argument("--concurrency", type=int, default=100, help="Rota worker concurrency")
    parser.add_argument("--only-rota", action="store_true")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from rota.testing import EmbeddedPostgres

    say = lambda text: print(f"... {text}", file=sys.stderr, flush=True)  # noqa: E731
    with EmbeddedPostgres(durable=True) as server:
        results = measure(
            server.create_database,
            args.jobs,
            args.single_jobs,
            args.latency_jobs,
            args.gap,
            args.concurrency,
            peers=not args.only_rota,
            say=say,
        )
    print(
        f"\n{platform.machine()}, {_cores()} cores, Python {platform.python_version()}, "
        f"load average {_load()} at the end\n"
    )
    print(table(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(_jsonable(results), out, indent=2)
    return 0


def _load() -> str:
    import os

    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
