"""`python -m bench.limits_ab`: the drain under a limit that never binds, beside the
drain without one, in alternating rounds on one durable PostgreSQL server.

The flow-control rows of `make bench` measure the same thing among everything
else; this runs only them, with more rounds, for a change to the limited claim.

    python -m bench.limits_ab --rounds 6 --processes 2
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys

from bench import rota_bench
from bench.run import NON_BINDING_LIMIT
from bench.server import Server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.limits_ab", description=__doc__)
    rota_bench.add_drain_options(parser, rounds=6)
    args = parser.parse_args(argv)
    rota_bench.check_drain_options(parser, args)

    from rota.testing import EmbeddedPostgres

    names = itertools.count()
    rates: dict[int | None, list[float]] = {None: [], NON_BINDING_LIMIT: []}
    with EmbeddedPostgres(durable=True) as pg:
        server = Server(pg.data, pg.url())
        try:
            for round_ in range(args.rounds):
                order = [None, NON_BINDING_LIMIT][:: 1 if round_ % 2 == 0 else -1]
                for limit in order:
                    print(f"... round {round_ + 1}: limit {limit}", file=sys.stderr, flush=True)
                    drain = rota_bench.drain(
                        lambda name: pg.create_database(f"{name}_{next(names)}"),
                        args.jobs,
                        args.processes,
                        args.concurrency,
                        server,
                        limit=limit,
                    )
                    rates[limit].append(drain.rate)
        finally:
            server.close()
    plain, limited = rates[None], rates[NON_BINDING_LIMIT]
    print(
        f"\n{args.jobs:,} no-op jobs per drain, {args.processes} process(es), concurrency "
        f"{args.concurrency}, {args.rounds} rounds\n"
    )
    print("| drain | median jobs/s | rounds |")
    print("|---|---:|---|")
    for label, values in (("plain", plain), ("non-binding limit", limited)):
        each = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {label} | {statistics.median(values):,.0f} | {each} |")
    ratios = [lim / p for p, lim in zip(plain, limited, strict=True)]
    print(
        f"\nratio of the medians {statistics.median(limited) / statistics.median(plain):.2f};"
        f" per round {', '.join(f'{r:.2f}' for r in ratios)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
