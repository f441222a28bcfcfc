"""Database failover: the primary goes, its streaming standby is promoted, Rota carries on.

Workers, a `rota scheduler` and a `rota reaper` (the only ones: the workers run
neither), and the operator's database measures, are all given one multi-host
URL with target_session_attrs=read-write, so every (re)connection finds
whichever server accepts writes. Replication is asynchronous: the test cuts the
standby off from the primary a while before the primary stops, so the
completions of that while are known not to have reached the standby. Those jobs
run again (at-least-once allows it); every other job runs once, none is lost.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest

import rota
from rota import schedule_store
from rota.metrics import QueueCollector
from rota.testing import EmbeddedPostgres
from tests.acceptance.procs import wait_for
from tests.pgcluster import CrashSafePostgres, StreamingStandby
from tests.soak.harness import Fleet

TYPE = "failover.run"
PROBE = "soak.noop"
JOBS = 800


@pytest.fixture
def cluster() -> Iterator[tuple[EmbeddedPostgres, StreamingStandby]]:
    # Commits acknowledged by the primary are in its WAL, as with PostgreSQL's
    # defaults: what the standby misses is only what replication had not sent.
    with CrashSafePostgres() as primary:
        standby = StreamingStandby(primary)
        try:
            standby.start()
            yield primary, standby
        finally:
            standby.destroy()


def multi_host_url(*servers: EmbeddedPostgres) -> str:
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


def due_schedule(url: str, name: str) -> int:
    """A schedule of `PROBE` jobs every minute, its latest slot due now; returns its id."""
    row = schedule_store.upsert(url, schedule_store.ScheduleSpec(name, PROBE, "* * * * *"))
    scalar(
        url,
        "UPDATE rota.schedule SET next_run_at = date_trunc('minute', now()) - interval '1 minute'"
        " WHERE id = %s RETURNING id",
        row["id"],
    )
    return int(row["id"])


def scalar(url: str, statement: str, *params: Any) -> Any:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(statement, params).fetchone()
    except psycopg.OperationalError:
        return None
    return None if row is None else row[0]


def done_ids(url: str) -> set[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT id FROM rota.job WHERE type = %s AND status = 'done'", (TYPE,))
        return {r[0] for r in rows}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(True, id="standby-cut-off-first"),
        pytest.param(
            False,
            id="standby-streaming-to-the-end",
            marks=pytest.mark.skipif(
                os.environ.get("ROTA_SOAK") != "full", reason="make soak runs it (ROTA_SOAK=full)"
            ),
        ),
    ],
)
def test_workers_scheduler_and_operator_carry_on_after_the_standby_is_promoted(
    cluster: tuple[EmbeddedPostgres, StreamingStandby], tmp_path: Path, cut: bool
) -> None:
    """`cut`: replication stops a while before the primary does, so some
    completions surely never reach the standby; otherwise the primary crashes
    while streaming, and only what was in flight is lost."""
    from rota_operator import metrics as operator_metrics

    primary, standby = cluster
    url = multi_host_url(primary, standby)
    rota.migrate(url)
    scalar(url, "UPDATE rota.schedule SET suspend = true WHERE name = 'rota/archive' RETURNING id")
    ids = rota.enqueue_many(url, [rota.NewJob(TYPE, {"ms": i % 20}) for i in range(JOBS)])
    standby.wait_caught_up()  # the jobs exist on both servers

    runs = tmp_path / "runs.log"
    fleet = Fleet(url, tmp_path, ROTA_RUNS_LOG=str(runs))
    operator_metrics.serve_database_measures(url)
    try:
        # The scheduler and the reaper first, each seen at work before the
        # workers start (and so before the failover): a due slot enqueued, an
        # expired lease reset.
        before = due_schedule(url, "failover/before")
        stale = rota.enqueue(url, PROBE)
        scalar(
            url,
            "UPDATE rota.job SET status = 'running', locked_by = 'gone', attempts = 1,"
            " locked_until = now() - interval '1 minute' WHERE id = %s RETURNING id",
            stale,
        )
        fleet.start("scheduler", "scheduler")
        fleet.start("reaper", "reaper", "--interval", "0.5")
        wait_for(
            lambda: scalar(url, "SELECT count(*) FROM rota.job WHERE schedule_id = %s", before),
            what="the scheduler's first slot",
        )
        wait_for(
            lambda: scalar(url, "SELECT status FROM rota.job WHERE id = %s", stale) == "ready",
            what="the reaper's first reset",
        )
        # Workers without their own scheduler and reaper: whatever is scheduled
        # or reset after the failover shows that those two processes carried on.
        worker_args = ("--concurrency", "4", "--lease", "3", "--poll-interval", "0.5")
        worker_args += ("--no-scheduler", "--no-reaper")
        workers = [fleet.worker(*worker_args) for _ in range(2)]
        count_done = "SELECT count(*) FROM rota.job WHERE type = 'failover.run' AND status = 'done'"
        wait_for(lambda: (scalar(url, count_done) or 0) >= JOBS // 4, what="a quarter done")
        assert b"rota_jobs" in generate_latest(operator_metrics.REGISTRY)

        if cut:  # replication stops here; the primary works on alone for a while
            standby.cut_off()
            replicated = done_ids(standby.url())
            wait_for(
                lambda: (scalar(primary.url(), count_done) or 0) >= len(replicated) + JOBS // 8,
                what="completions that will not reach the standby",
            )
        failed_at = time.monotonic()
        primary.stop("immediate")
        if not cut:
            replicated = done_ids(standby.url())
        on_primary_only = JOBS - len(replicated)  # upper bound, see below
        standby.promote()
        promoted_at = time.monotonic()
        wait_for(
            lambda: (scalar(standby.url(), count_done) or 0) > len(replicated),
            timeout=120,
            what="a first completion on the promoted standby",
        )
        recovered_at = time.monotonic()
        wait_for(
            lambda: scalar(standby.url(), count_done) == JOBS,
            timeout=240,
            what="every job done on the promoted standby",
        )
        all_done_at = time.monotonic()

        # The scheduler found the new primary too: a due slot is enqueued and run.
        after = due_schedule(url, "failover/after")
        wait_for(
            lambda: (
                scalar(url, "SELECT status FROM rota.job WHERE schedule_id = %s", after) == "done"
            ),
            timeout=120,
            what="the scheduled job on the promoted standby",
        )
        for schedule in (before, after):
            scalar(
                url, "UPDATE rota.schedule SET suspend = true WHERE id = %s RETURNING id", schedule
            )

        # The operator's database measures, read through the same URL, come
        # from the promoted standby.
        scraped = [b""]

        def scrape() -> bool:
            done = scalar(url, count_done)
            done_line = f'rota_jobs{{status="done",type="{TYPE}"}} {done}.0'.encode()
            scraped[0] = generate_latest(operator_metrics.REGISTRY)
            return done_line in scraped[0]

        try:
            wait_for(scrape, timeout=60, what="the operator's measures from the promoted standby")
        except AssertionError:
            lines = [x for x in scraped[0].decode().splitlines() if x.startswith("rota_jobs")]
            done = scalar(url, count_done)
            raise AssertionError(f"want {done} done, scraped {lines}") from None
        status = QueueCollector(url, cache_seconds=0).status()
        assert status is not None
        assert status.types[TYPE].done == scalar(url, count_done)
        assert all(w.alive() for w in workers)
        assert len(fleet.alive("scheduler")) == len(fleet.alive("reaper")) == 1
    finally:
        # Stop serving this test's database measures (the server goes away).
        while operator_metrics._database:
            collector = operator_metrics._database.pop()
            operator_metrics.REGISTRY.unregister(collector)
            collector.close_connection()
        codes = fleet.stop_all()
    assert list(codes.values()) == [0] * len(codes)

    with psycopg.connect(standby.url()) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
        running = conn.execute("SELECT count(*) FROM rota.job WHERE status = 'running'").fetchone()
    ran = Counter(int(line.split()[0]) for line in runs.read_text().splitlines())
    ran_again = {job for job, n in ran.items() if n > 1 and job in set(ids)}
    figures = {
        "standby_cut_off_first": cut,
        "jobs": JOBS,
        "lost": JOBS - len(done_ids(standby.url()) & set(ids)),
        "never_ran": len(set(ids) - set(ran)),
        "done_on_standby": len(replicated),
        "reruns": sum(ran[job] - 1 for job in ran_again),
        "jobs_run_again": len(ran_again),
        "promote_seconds": round(promoted_at - failed_at, 2),
        "recover_seconds": round(recovered_at - failed_at, 2),
        "all_done_seconds": round(all_done_at - failed_at, 2),
    }
    print("\nfailover:", json.dumps(figures))
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=2))
    assert running == (0,)
    assert figures["lost"] == 0 and figures["never_ran"] == 0
    # Only jobs whose completion had not reached the standby may run again.
    assert not ran_again & replicated
    assert len(ran_again) <= on_primary_only
    if cut:
        assert figures["jobs_run_again"] >= 1, "the completions made after the cut were not lost?"
