"""A job the archiver moved to rota.job_archive has ended: every door that acts
on jobs by id says so, instead of "no job with id", and changes nothing.

Cancelling it is what cancelling any ended job is (left alone); retrying it is
refused, with the reason: an archived job stays as it ended."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import rota
from rota import control
from rota.archive import Archiver, ArchiveSettings
from rota.cli import main
from tests.web.conftest import BEARER, make_client

JSON = {**BEARER, "Accept": "application/json"}


def archived_dead_job(conn: psycopg.Connection[Any]) -> int:
    job_id = rota.enqueue(conn, "report", {"month": "2026-11"})
    conn.execute(
        "UPDATE rota.job SET status = 'dead', attempts = 3, finished_at = now()"
        " - interval '90 days' WHERE id = %s",
        (job_id,),
    )
    Archiver(ArchiveSettings(failed_retention_seconds=60)).run_once(conn)
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone() == {"n": 0}
    return job_id


def archive_of(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return list(conn.execute("SELECT id, status, attempts FROM rota.job_archive").fetchall())


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str,
        *argv: str) -> tuple[int, str, str]:  # fmt: skip
    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_api_cancels_an_archived_job_as_an_ended_one(conn) -> None:
    job_id = archived_dead_job(conn)
    before = archive_of(conn)
    result = control.cancel(conn, [job_id])
    assert (result.ended, result.requested) == ([], [])
    assert archive_of(conn) == before
    with pytest.raises(rota.InvalidInput, match=r"no job with id 424242$"):
        control.cancel(conn, [job_id, 424242])


def test_the_api_says_an_archived_job_is_left_because_it_is_archived(conn) -> None:
    job_id = archived_dead_job(conn)
    result = control.retry_report(conn, [job_id, 424242])
    assert result.revived == []
    assert result.left == {job_id: "archived", 424242: "not dead"}
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone() == {"n": 0}


def test_the_command_line_names_an_archived_job(conn, db_url, monkeypatch, capsys) -> None:
    job_id = archived_dead_job(conn)
    before = archive_of(conn)
    code, out, err = run(monkeypatch, capsys, db_url, "dead", "retry", str(job_id))
    assert (code, out) == (2, "")
    assert err == (
        f"rota: error: job {job_id} is archived: an archived job stays as it ended"
        " (`rota jobs show` reads it; enqueue it again to run it)\n"
    )
    code, out, err = run(monkeypatch, capsys, db_url, "dead", "retry", str(job_id), "99")
    assert code == 2 and err.startswith("rota: error: no job with id 99; job 1 is archived")
    code, out, err = run(monkeypatch, capsys, db_url, "jobs", "cancel", str(job_id))
    assert (code, err) == (0, "")
    assert out == f"0 job(s) cancelled\nalready ended (left alone): [{job_id}]\n"
    assert archive_of(conn) == before
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone() == {"n": 0}


def test_the_console_answers_409_for_an_archived_job(conn, db_url) -> None:
    job_id = archived_dead_job(conn)
    before = archive_of(conn)
    with make_client(db_url) as client:
        for action, data in [("retry", {}), ("cancel", {}), ("run-now", {}),
                             ("priority", {"priority": "1"})]:  # fmt: skip
            response = client.post(f"/jobs/{job_id}/{action}", data=data, headers=JSON)
            assert response.status_code == 409, (action, response.text)
            assert f"job {job_id} is archived" in response.text
        assert client.post("/jobs/424242/retry", headers=JSON).status_code == 404
    assert archive_of(conn) == before
    assert conn.execute("SELECT count(*) AS n FROM rota.audit").fetchone() == {"n": 0}
