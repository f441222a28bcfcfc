"""Where a job's row versions land in rota.job's heap.

A claim and an outcome each write a new version of the job's row. When that
version fits on the row's own page, the job touches one heap page; when it
does not, each version lands on another page, and after a checkpoint every
page first touched writes a full-page image to the WAL. A table of finished
jobs, vacuumed, has a little free space on many pages: new jobs go one to a
page, and without room kept free on each page (fillfactor) their claim and
outcome scatter as well (a drain beside 2,000,000 done rows wrote 9,676 WAL
bytes a job against 1,428 on an empty table).
"""

from __future__ import annotations

from typing import Any

import psycopg

import rota
from rota import lookup
from rota.claim import Attempt, claim, write_outcomes
from rota.jobs import Outcome


def _pages(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, int]:
    rows = conn.execute(
        "SELECT id, (ctid::text::point)[0]::bigint FROM rota.job WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return {row[0]: row[1] for row in rows}


def test_a_jobs_claim_and_outcome_stay_on_its_page_among_finished_jobs(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        # Finished jobs, larger than a new one, packed full (as rows stored
        # before the room was kept are), a third of them archived since.
        row = c.execute("SELECT reloptions FROM pg_class WHERE oid = 'rota.job'::regclass")
        (options,) = row.fetchone() or ([],)
        c.execute("ALTER TABLE rota.job SET (fillfactor = 100)")
        c.execute(
            "INSERT INTO rota.job (type, payload, status, run_at, attempts, locked_by,"
            " created_at, started_at, finished_at)"
            " SELECT 'report', jsonb_build_object('i', g), 'done', now(), 1,"
            " 'worker:0:' || lpad(g::text, 12, '0'), now(), now(), now()"
            " FROM generate_series(1, 20000) AS g"
        )
        c.execute("DELETE FROM rota.job WHERE id % 3 = 0")
        c.execute(f"ALTER TABLE rota.job SET ({', '.join(options)})".encode())
        c.execute("VACUUM ANALYZE rota.job")
        ids = list(rota.enqueue_many(c, [rota.NewJob("report") for _ in range(50)]))
        placed = _pages(c, ids)
        assert len(set(placed.values())) >= 15  # a few to a page, where space was
        jobs = claim(c, "w", 50, 30)
        assert len(jobs) == 50
        claimed = _pages(c, ids)
        write_outcomes(c, "w", [Attempt.of(j, Outcome.DONE) for j in jobs])
        finished = _pages(c, ids)
    stayed = sum(placed[i] == claimed[i] == finished[i] for i in ids)
    assert stayed >= 45, (stayed, placed, claimed, finished)


def test_a_claimed_and_finished_batch_stays_on_its_pages(db_url: str) -> None:
    # A batch enqueued together fills its pages; claimed and finished together,
    # its new versions fit beside the old ones only with room kept on each page
    # (migration 0023 keeps 30 %: 64 of 200 stay, 15 with a tenth, 162 with half).
    with psycopg.connect(db_url, autocommit=True) as c:
        ids = list(rota.enqueue_many(c, [rota.NewJob("report", {"i": i}) for i in range(200)]))
        placed = _pages(c, ids)
        jobs = claim(c, "w", 200, 30)
        assert len(jobs) == 200
        claimed = _pages(c, ids)
        write_outcomes(c, "w", [Attempt.of(j, Outcome.DONE) for j in jobs])
        finished = _pages(c, ids)
    assert len(set(placed.values())) >= 4  # the batch filled several pages
    stayed = sum(placed[i] == claimed[i] == finished[i] for i in ids)
    assert stayed >= 50, (stayed, placed, claimed, finished)  # 64 of 200; 15 with a tenth free


def _type_index_entries(conn: psycopg.Connection[Any]) -> int:
    conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    row = conn.execute(
        "SELECT sum(s.live_items)"
        " FROM generate_series(1, pg_relation_size('rota.job_type_idx') / 8192 - 1) AS b,"
        " LATERAL bt_page_stats('rota.job_type_idx', b::int) AS s"
        " WHERE s.type = 'l'"
    ).fetchone()
    assert row is not None
    return int(row[0] or 0)


def test_a_claim_adds_no_entry_to_the_type_index(db_url: str) -> None:
    # The type index (`jobs list --type`) holds no running versions: the claim,
    # the most frequent write, adds nothing to it, and the running jobs of a
    # type are found among the running rows. Every other version is entered.
    with psycopg.connect(db_url, autocommit=True) as c:
        ids = list(rota.enqueue_many(c, [rota.NewJob("report") for _ in range(40)]))
        assert _type_index_entries(c) == 40
        jobs = claim(c, "w", 40, 30)
        assert len(jobs) == 40
        assert _type_index_entries(c) == 40
        write_outcomes(c, "w", [Attempt.of(j, Outcome.DONE) for j in jobs])
        assert _type_index_entries(c) == 80
        listed = lookup.list_jobs(c, job_type="report", limit=100)
    assert [j.id for j in listed] == sorted(ids, reverse=True)
