"""Readers that no row can crash.

Rows written around every check (by a superuser with triggers off: infinity and
the year 20000 as times, JSON nested 5,000 deep, errors of the wrong shape, a
type of 3,000 bytes) sit beside ordinary jobs. `rota jobs list/show`, `rota
status`, `rota dead list`, the reaper, the scheduler, the archiver and every
console page keep working, show such values as their raw text, and leave the
ordinary jobs alone.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import rota
from rota.archive import Archiver, ArchiveSettings
from rota.attempt import Attempt
from rota.claim import claim, write_outcomes
from rota.cli import main
from rota.jobs import Outcome, Status
from rota.reaper import Reaper
from rota.scheduler import Scheduler

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from tests.web.conftest import BEARER, HTML, make_client  # noqa: E402

DEEP = "(repeat('[', 5000) || repeat(']', 5000))::jsonb"

AROUND_THE_CHECKS = f"""
SET session_replication_role = replica;
INSERT INTO rota.job (type, run_at) VALUES ('bad.infinity', 'infinity');
INSERT INTO rota.job (type, run_at) VALUES ('bad.year', '20000-01-01Z');
INSERT INTO rota.job (type, run_at) VALUES ('bad.minus', '-infinity');
INSERT INTO rota.job (type, payload) VALUES ('bad.deep', {DEEP});
INSERT INTO rota.job (type, payload, status, finished_at, attempts, last_error)
    VALUES ('bad.dead', {DEEP}, 'dead', 'infinity', 3, repeat('e', 10000));
INSERT INTO rota.job (type, status, locked_by, locked_until, attempts, started_at)
    VALUES ('bad.running', 'running', 'gone', now() - interval '1 hour', 1, '20000-01-01Z');
INSERT INTO rota.job (type, errors, result, trace_context, status, finished_at)
    VALUES ('bad.shapes', '{{"not": "a list"}}', {DEEP}, '"x"', 'done', '-infinity');
INSERT INTO rota.job (type, errors)
    VALUES ('bad.errors', '[{{"attempt": "x", "at": "infinity", "error": 5}}, 7]');
INSERT INTO rota.job (type, created_at) VALUES (repeat('x', 3000), 'infinity');
INSERT INTO rota.job (type, timeout_seconds) VALUES ('bad.timeout', 'NaN');
INSERT INTO rota.schedule (name, job_type, cron, next_run_at, payload)
    VALUES ('bad-payload', 't', '* * * * *', now() - interval '1 minute', {DEEP});
INSERT INTO rota.schedule (name, job_type, cron, next_run_at)
    VALUES ('bad-next', 't', '* * * * *', '-infinity');
RESET session_replication_role;
"""


@pytest.fixture
def poisoned(conn: psycopg.Connection[Any]) -> Iterator[dict[str, Any]]:
    """The bad rows, an ordinary job before and after them, and their ids."""
    first = rota.enqueue(conn, "ordinary", {"n": 1})
    conn.execute(AROUND_THE_CHECKS)  # type: ignore[arg-type]
    last = rota.enqueue(conn, "ordinary", {"n": 2})
    rows = conn.execute(
        "SELECT id, left(type, 20) AS type FROM rota.job WHERE type <> 'ordinary'"
    ).fetchall()
    yield {"ordinary": [first, last], **{r["type"]: r["id"] for r in rows}}


def _ordinary(conn: psycopg.Connection[Any]) -> list[Any]:
    return conn.execute(
        "SELECT id, status, attempts FROM rota.job WHERE type = 'ordinary' ORDER BY id"
    ).fetchall()


def _cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, *argv: str
) -> str:
    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, (argv, err)
    return out


def test_the_cli_lists_shows_and_counts_every_row(
    poisoned: dict[str, Any],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    listed = _cli(monkeypatch, capsys, db_url, "jobs", "list")
    assert "infinity" in listed and "20000-01-01" in listed and "-infinity" in listed
    as_json = json.loads(_cli(monkeypatch, capsys, db_url, "jobs", "list", "--json"))
    assert {job["id"] for job in as_json} >= set(poisoned["ordinary"])
    assert "bad.dead" in _cli(monkeypatch, capsys, db_url, "dead", "list")
    for job_id in [v for k, v in poisoned.items() if k != "ordinary"]:
        shown = _cli(monkeypatch, capsys, db_url, "jobs", "show", str(job_id))
        assert str(job_id) in shown
        json.loads(_cli(monkeypatch, capsys, db_url, "jobs", "show", str(job_id), "--json"))
    deep = _cli(monkeypatch, capsys, db_url, "jobs", "show", str(poisoned["bad.deep"]))
    assert "[[[[[[[[" in deep  # the payload as stored, raw
    assert "ordinary" in _cli(monkeypatch, capsys, db_url, "status")
    json.loads(_cli(monkeypatch, capsys, db_url, "status", "--json"))


def test_rota_result_reads_every_row(
    poisoned: dict[str, Any], conn: psycopg.Connection[Any]
) -> None:
    # rota.result read payload, result and errors with json.loads: JSON nested
    # past Python's recursion, or an integer of 5,000 digits, raised.
    huge = rota.enqueue(conn, "ordinary", {"n": 3})
    conn.execute(
        "UPDATE rota.job SET result = ('[' || repeat('9', 5000) || ']')::jsonb WHERE id = %s",
        (huge,),
    )
    for job_id in [v for k, v in poisoned.items() if k != "ordinary"]:
        rota.result(conn, job_id)
    status, result = rota.result(conn, poisoned["bad.shapes"])
    assert status is Status.DONE and result.startswith("[[[[[[[[")  # its text as stored
    assert rota.result(conn, huge)[1] == "[" + "9" * 5000 + "]"


def test_a_durable_job_s_trail_shows_times_past_python_s_range(
    conn: psycopg.Connection[Any],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `rota jobs show --json` copies the trail (dataclasses.asdict): a copy of
    # a time read as its raw text came back with bytes for its text, and the
    # JSON writer failed on it.
    job_id = rota.enqueue(conn, "durable", {})
    conn.execute(
        "INSERT INTO rota.job_step (job_id, name, result, attempt, started_at, finished_at)"
        " VALUES (%s, 's', NULL, 1, 'infinity', now())",
        (job_id,),
    )
    shown = json.loads(_cli(monkeypatch, capsys, db_url, "jobs", "show", str(job_id), "--json"))
    assert "infinity" in json.dumps(shown)


def test_the_maintenance_loops_pass_over_the_bad_rows_alone(
    poisoned: dict[str, Any], conn: psycopg.Connection[Any], db_url: str
) -> None:
    before = _ordinary(conn)
    assert Reaper().run_once(db_url).count == 1  # the expired lease of bad.running
    fired = Scheduler().run_once(db_url)
    assert fired.schedules == 2 and fired.missed == 2  # each bad schedule passes its slot
    later = datetime.now(UTC) + timedelta(days=30)
    every = ArchiveSettings(done_retention_seconds=0, failed_retention_seconds=0)
    Archiver(every).run_once(db_url, now=later)
    assert _ordinary(conn) == before  # no ordinary job lost an attempt or moved
    schedules = conn.execute(
        "SELECT name, next_run_at > now() AS ahead FROM rota.schedule"
        " WHERE name LIKE 'bad-%%' ORDER BY name"
    ).fetchall()
    assert schedules == [
        {"name": "bad-next", "ahead": True},
        {"name": "bad-payload", "ahead": True},
    ]


# Running jobs whose rows break a rule of the checks in a column the reaper and
# a retry do not change: written around the checks, or before 0024 made them.
OLD_RUNNING = """
SET session_replication_role = replica;
INSERT INTO rota.job (type, group_key, status, locked_by, locked_until, attempts)
    VALUES ('old.group', repeat('g', 2000), 'running', 'w', now() - interval '1 hour', 1),
           ('old.timeout', NULL, 'running', 'w', now() - interval '1 hour', 1),
           (' ', NULL, 'running', 'w', now() + interval '1 hour', 1);
UPDATE rota.job SET timeout_seconds = 'NaN' WHERE type = 'old.timeout';
RESET session_replication_role;
"""


def test_leases_and_retries_of_rows_past_the_limits_are_written(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    # The reaper gives back every expired lease and a worker's retry is written:
    # neither writes a value the checks would refuse (a new run_at within the
    # limits), so neither is refused for a value it leaves as it was. Refused,
    # one such row stopped the reaper's every batch, and the expired leases of
    # every other job with it, and its own job stayed running.
    ordinary = rota.enqueue(conn, "ordinary", {"n": 1})
    conn.execute(
        "UPDATE rota.job SET status = 'running', locked_by = 'w', attempts = 1,"
        " locked_until = now() - interval '1 hour' WHERE id = %s",
        (ordinary,),
    )
    conn.execute(OLD_RUNNING)
    assert Reaper().run_once(db_url).count == 3
    rows = conn.execute(
        "SELECT type, status, attempts FROM rota.job WHERE locked_until IS NULL ORDER BY id"
    ).fetchall()
    assert rows == [
        {"type": "ordinary", "status": "ready", "attempts": 1},
        {"type": "old.group", "status": "ready", "attempts": 1},
        {"type": "old.timeout", "status": "ready", "attempts": 1},
    ]
    (blank,) = conn.execute("SELECT id FROM rota.job WHERE type = ' '").fetchall()
    conn.execute("UPDATE rota.job SET claims = 1 WHERE id = %s", (blank["id"],))
    retry = Attempt(blank["id"], 1, Outcome.RETRY, delay=5.0, error="boom", claim=1)
    assert write_outcomes(conn, "w", [retry]) == {(blank["id"], 1): Status.READY}


def test_an_expired_lease_and_a_retry_pass_over_errors_of_another_shape(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    # `errors` is a column a plain INSERT or UPDATE may fill with any JSON. An
    # object or a number there failed the reaper's every batch ("cannot get array
    # length of a non-array"), and the expired leases of every job with it.
    ordinary = rota.enqueue(conn, "ordinary", {"n": 1})
    odd = [rota.enqueue(conn, "odd", {"n": n}) for n in range(3)]
    conn.execute(
        "UPDATE rota.job SET status = 'running', locked_by = 'w', attempts = 1,"
        " locked_until = now() - interval '1 hour'"
    )
    for job_id, errors in zip(odd, ['{"x": 1}', "5", '"text"'], strict=True):
        conn.execute("UPDATE rota.job SET errors = %s WHERE id = %s", (errors, job_id))
    assert Reaper().run_once(db_url).count == 4
    rows = conn.execute("SELECT status, errors FROM rota.job ORDER BY id").fetchall()
    assert [r["status"] for r in rows] == ["ready"] * 4
    assert [len(r["errors"]) for r in rows] == [1] * 4  # the lease's expiry, kept alone
    conn.execute(
        "UPDATE rota.job SET status = 'running', attempts = 2, claims = 2, locked_by = 'w'"
    )
    conn.execute("UPDATE rota.job SET errors = '{\"x\": 1}' WHERE id = %s", (ordinary,))
    retry = Attempt(ordinary, 2, Outcome.RETRY, delay=5.0, error="boom", claim=2)
    assert write_outcomes(conn, "w", [retry]) == {(ordinary, 2): Status.READY}


def test_a_running_job_without_a_lease_is_given_back(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    # A plain INSERT or UPDATE may make a job running with no lease at all; the
    # reaper looked only for leases in the past, so such a job stayed running
    # forever, its worker gone or never there.
    leaseless = rota.enqueue(conn, "ordinary", {"n": 1})
    held = rota.enqueue(conn, "ordinary", {"n": 2})
    conn.execute(
        "UPDATE rota.job SET status = 'running', attempts = 1, locked_by = 'w',"
        " locked_until = CASE WHEN id = %s THEN NULL ELSE now() + interval '1 hour' END",
        (leaseless,),
    )
    conn.execute("INSERT INTO rota.job (type, status) VALUES ('inserted', 'running')")
    assert Reaper().run_once(db_url).count == 2
    rows = conn.execute("SELECT id, type, status FROM rota.job ORDER BY id").fetchall()
    assert [(r["type"], r["status"]) for r in rows] == [
        ("ordinary", "ready"),
        ("ordinary", "running"),
        ("inserted", "ready"),
    ]
    assert rows[1]["id"] == held


def test_no_writer_leaves_a_rate_window_the_claims_cannot_count(
    conn: psycopg.Connection[Any],
) -> None:
    # A window no time can be moved back by made every claim fail, of every type
    # ("interval out of range"). A CHECK keeps it out even with triggers off.
    rota.set_limit(conn, "limited", rate=2, per=60)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "SET session_replication_role = replica;"
            " UPDATE rota.job_limit SET per_seconds = 'Infinity';"
        )
    conn.execute("RESET session_replication_role")
    ids = [rota.enqueue(conn, t, {}) for t in ("limited", "limited", "limited", "other")]
    claimed = claim(conn, "w", 10, 60)
    assert sorted(j.id for j in claimed) == sorted([ids[0], ids[1], ids[3]])


def test_every_console_page_answers(poisoned: dict[str, Any], db_url: str) -> None:
    with make_client(db_url) as client:
        pages = ["/", "/jobs", "/jobs?status=dead", "/jobs?status=ready", "/dead", "/schedules",
                 "/types", "/workers", "/audit"]  # fmt: skip
        pages += [f"/jobs/{v}" for k, v in poisoned.items() if k != "ordinary"]
        for page in pages:
            for headers in (HTML, {}):
                response = client.get(page, headers={**BEARER, **headers})
                assert response.status_code == 200, (page, response.text[-500:])
        job = client.get(f"/jobs/{poisoned['bad.infinity']}", headers={**BEARER, **HTML})
        assert "infinity" in job.text


def test_counts_past_a_bigint_in_sum_are_read_as_the_largest(
    conn: psycopg.Connection[Any],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each shard of a count holds a bigint; their sum may not. The console's
    # overview, `rota status` and the sample every worker records read the sum.
    big = 2**63 - 1
    for table in ("job_done_count", "job_dead_count"):
        conn.execute(
            f"INSERT INTO rota.{table} (type, shard, count)"
            " VALUES ('huge', 1, %s), ('huge', 2, %s)",
            (big, big),
        )
    conn.execute(
        "INSERT INTO rota.job_failure_count (minute, type, count)"
        " SELECT date_trunc('minute', now()), 'huge', n FROM unnest(ARRAY[%s, %s]::bigint[]) AS n",
        (big, big),
    )
    assert "huge" in _cli(monkeypatch, capsys, db_url, "status")
    from rota import workers

    assert workers.record_sample(db_url)
    with make_client(db_url) as client:
        for page in ("/", "/?range=7d", "/types"):
            response = client.get(page, headers={**BEARER, **HTML})
            assert response.status_code == 200, (page, response.text[-500:])
