"""An archived row whose status no reader knows: the archive's CHECK came with
migration 0039 `NOT VALID`, so rows archived before it are never read again by the
database, and such a row may still be there. Every reader shows it as stored."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import rota
from rota import lookup
from rota.cli import main
from tests.archived_rows import archive_as_before_the_check
from tests.web.conftest import BEARER, HTML

OLD_STATUS = "sleeping"


@pytest.fixture
def archived(conn: psycopg.Connection[Any]) -> int:
    """A job archived in a status no reader knows, as a row older than the check."""
    job_id = rota.enqueue(conn, "report", {"n": 1})
    archive_as_before_the_check(conn, OLD_STATUS, [job_id])
    return job_id


def test_jobs_show_prints_the_status_as_stored(capsys, monkeypatch, db_url, archived) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["jobs", "show", str(archived)]) == 0
    out, err = capsys.readouterr()
    assert ["status", OLD_STATUS] in [line.split() for line in out.splitlines()], (out, err)
    assert main(["jobs", "show", str(archived), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == OLD_STATUS and shown["archived_at"]


def test_the_api_reads_it(conn, archived) -> None:
    found = lookup.outcome(conn, archived)
    assert (found["status"], found["payload"]) == (OLD_STATUS, {"n": 1})
    assert rota.result(conn, archived) == (OLD_STATUS, None)


def test_the_consoles_job_page_shows_it(client, archived) -> None:
    page = client.get(f"/jobs/{archived}", headers={**BEARER, **HTML})
    assert page.status_code == 200, page.text[-400:]
    assert OLD_STATUS in page.text
