"""What a page of dead (failed, cancelled) jobs reads: the newest rows of the
status, not every one of them. The status's partial index read whole and
sorted took 100-370 ms a page beside 100,000 dead jobs; walking the newest
rows by id finds a page among the done ones in a few hundred rows."""

from __future__ import annotations

import psycopg

from rota.jobs import Status
from rota.web.filters import JobFilter
from rota.web.reads import job_page
from tests.table_reads import rows_read

JOBS = 100_000


def test_a_page_of_dead_jobs_reads_the_newest_rows_only(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        setup.execute(
            "INSERT INTO rota.job (type, status, attempts, finished_at, last_error)"
            " SELECT 't', CASE WHEN n %% 5 = 0 THEN 'dead' ELSE 'done' END, 1, now(), 'E'"
            " FROM generate_series(1, %s) AS n",
            (JOBS,),
        )
        setup.execute("VACUUM ANALYZE rota.job")
        [(first_dead,)] = setup.execute(
            "SELECT max(id) FROM rota.job WHERE status = 'dead'"
        ).fetchall()
    with psycopg.connect(db_url) as conn:  # one transaction: its own counters
        page = job_page(conn, JobFilter(status=Status.DEAD), None, 50)
        later = job_page(conn, JobFilter(status=Status.DEAD), page.next_before, 50)
        read = rows_read(conn)
        conn.rollback()
    ids = [r["id"] for r in page.rows + later.rows]
    assert ids[0] == first_dead and ids == sorted(ids, reverse=True) and len(ids) == 100
    assert all(r["status"] == "dead" for r in page.rows + later.rows)
    assert read < 2_000, read  # two pages among four done jobs for each dead one
