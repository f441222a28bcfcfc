"""`python -m bench.workers_ab`: Rota's drain with worker variants side by side.

One durable PostgreSQL server; each variant is a Python interpreter (any with
Rota installed, e.g. a virtualenv of another Python version) and extra `rota
worker` flags. In every round each variant drains the same number of no-op
jobs with 1 and 2 processes, the variants taking turns (each round starts with
another), and the table gives the median of the rounds: jobs/s, server and
worker CPU per 1,000 jobs. With `--latency-jobs N`, every round also sends N
jobs one at a time to one idle worker of each variant, as `make bench`'s
latency rounds do, and a second table gives the enqueue-to-start p50 and p99
and the part after the enqueue call's return. It measures what a change to
the worker's own costs buys, against the worker without it, in one run. A
variant's workers run from the checkout its interpreter imports Rota from, so
another checkout's virtualenv measures that checkout's worker (a commit before
a change).

    python -m bench.workers_ab --variant "3.11=.venv/bin/python" \\
        --variant "3.13=/path/to/venv313/bin/python" \\
        --variant "3.13 lazy=/path/to/venv313/bin/python --no-eager-tasks"
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from bench import measure, rota_bench
from bench.run import Plan
from bench.server import Server


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """ "label=python [flags...]" -> (label, python, flags)."""
    label, sep, rest = text.partition("=")
    words = shlex.split(rest)
    if not sep or not label or not words:
        raise argparse.ArgumentTypeError(f"--variant wants LABEL=PYTHON [FLAGS], not {text!r}")
    return label, words[0], words[1:]


def _version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _checkout(python: str) -> Path:
    """The checkout whose Rota `python` imports (its workers run from there, with its
    bench.handlers), or this one when that Rota is not a checkout."""
    done = subprocess.run(
        [
            os.path.abspath(python) if os.sep in python else python,
            "-c",
            "import pathlib, rota; print(pathlib.Path(rota.__file__).parent.parent)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    root = Path(done.stdout.strip()).resolve()
    return root if (root / "bench" / "handlers.py").is_file() else measure.ROOT


def _listed(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.workers_ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--variant", action="append", type=parse_variant, required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument(
        "--latency-jobs", type=int, default=0, help="jobs per latency round (0: none)"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.jobs <= 0 or args.rounds <= 0 or args.latency_jobs < 0:
        parser.error("--jobs and --rounds must be positive, --latency-jobs not negative")

    from rota.testing import EmbeddedPostgres

    names = itertools.count()
    results: dict[str, dict[int, list[measure.Drain]]] = {
        label: {1: [], 2: []} for label, _, _ in args.variant
    }
    waits: dict[str, list[measure.Latency]] = {label: [] for label, _, _ in args.variant}
    versions = {label: _version(python) for label, python, _ in args.variant}
    checkouts = {label: _checkout(python) for label, python, _ in args.variant}
    here = measure.ROOT
    for label, checkout in checkouts.items():
        print(f"... {label}: Python {versions[label]}, Rota from {checkout}", file=sys.stderr)
    with EmbeddedPostgres(durable=True) as pg:
        server = Server(pg.data, pg.url())
        new_database = lambda name: pg.create_database(f"{name}_{next(names)}")  # noqa: E731
        try:
            for round_ in range(args.rounds):
                shift = round_ % len(args.variant)
                for label, python, flags in args.variant[shift:] + args.variant[:shift]:
                    measure.PYTHON = python
                    measure.ROOT = checkouts[label]
                    rota_bench.EXTRA_WORKER_ARGS[:] = flags
                    try:
                        for processes in (1, 2):
                            print(
                                f"... round {round_ + 1}: {label}, {processes} process(es)",
                                file=sys.stderr,
                                flush=True,
                            )
                            results[label][processes].append(
                                rota_bench.drain(
                                    new_database, args.jobs, processes, args.concurrency, server
                                )
                            )
                        if args.latency_jobs:
                            print(f"... round {round_ + 1}: {label}, latency", file=sys.stderr)
                            waits[label].append(
                                rota_bench.latency(new_database, args.latency_jobs, Plan.gap)
                            )
                    finally:
                        measure.PYTHON = sys.executable
                        measure.ROOT = here
                        rota_bench.EXTRA_WORKER_ARGS[:] = []
        finally:
            server.close()
    rows = []
    print(
        f"\n{args.jobs:,} no-op jobs per drain, concurrency {args.concurrency}, "
        f"{args.rounds} round(s), median of the rounds; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n"
    )
    print("| variant | Python | processes | jobs/s | server CPU s/1,000 | worker CPU s/1,000 |")
    print("|---|---|---:|---:|---:|---:|")
    for label, by_processes in results.items():
        for processes, drains in by_processes.items():
            row = {
                "variant": label,
                "python": versions[label],
                "processes": processes,
                "rates": [d.rate for d in drains],
                "rate": statistics.median(d.rate for d in drains),
                "server_cpu": statistics.median(d.cpu_seconds_per_1000_jobs or 0.0 for d in drains),
                "worker_cpu": statistics.median(
                    d.worker_cpu_seconds_per_1000_jobs or 0.0 for d in drains
                ),
            }
            rows.append(row)
            print(
                f"| {label} | {row['python']} | {processes} | {row['rate']:,.0f} "
                f"| {row['server_cpu']:.3f} | {row['worker_cpu']:.3f} |"
            )
    if args.latency_jobs:
        print(
            f"\nenqueue-to-start, {args.latency_jobs} jobs a round, {Plan.gap * 1000:g} ms apart,"
            " to one idle worker; medians of the rounds (ms), each round's in brackets\n"
        )
        print("| variant | p50 | p99 | after the enqueue call's return, p50 |")
        print("|---|---|---:|---|")
        for label, runs in waits.items():
            p50s = [w.p50_ms for w in runs]
            after = [w.after_return_p50_ms or 0.0 for w in runs]
            print(
                f"| {label} | {statistics.median(p50s):.2f} ({_listed(p50s)}) "
                f"| {statistics.median(w.p99_ms for w in runs):.2f} "
                f"| {statistics.median(after):.2f} ({_listed(after)}) |"
            )
            rows.append({"variant": label, "latency": [dataclasses.asdict(w) for w in runs]})
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
