"""What `rota` prints of rows: text for people shows every value as it is, with
control characters escaped so none reaches the terminal; --json is strict
JSON that keeps the exact text."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import rota
from rota import flow
from rota.archive import Archiver, ArchiveSettings
from rota.cli import main

HOSTILE = "evil\x1b[31m\n\x01\x7f\x9b"
"""A name with an escape sequence, a line break, C0, DEL and C1 characters."""
ESCAPED = "evil\\x1b[31m\\n\\x01\\x7f\\x9b"
RAW = ("\x1b", "\x01", "\x7f", "\x9b")


def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str,
        *argv: str) -> str:  # fmt: skip
    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, (argv, err)
    return out


def strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def hostile(conn: psycopg.Connection[Any]) -> int:
    """A dead job whose type, worker, error and step carry control characters,
    with a limit and a schedule of such names."""
    job_id = rota.enqueue(conn, HOSTILE, {})
    conn.execute(
        "UPDATE rota.job SET status = 'dead', locked_by = %(h)s, last_error = %(h)s"
        " WHERE id = %(id)s",
        {"h": HOSTILE, "id": job_id},
    )
    conn.execute(
        "INSERT INTO rota.job_step (job_id, name, attempt, started_at, finished_at)"
        " VALUES (%s, %s, 1, now(), now())",
        (job_id, HOSTILE),
    )
    flow.set_limit(conn, HOSTILE, concurrency=1)
    conn.execute(
        "INSERT INTO rota.schedule (name, job_type, cron, next_run_at)"
        " VALUES (%s, %s, '* * * * *', now())",
        (HOSTILE, HOSTILE),
    )
    return job_id


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "list"],
        ["jobs", "show", "1"],
        ["dead", "list"],
        ["status"],
        ["limit", "list"],
        ["schedule", "list"],
    ],
)
def test_text_output_escapes_control_characters(capsys, monkeypatch, db_url, hostile,
                                                argv) -> None:  # fmt: skip
    out = cli(capsys, monkeypatch, db_url, *argv)
    assert ESCAPED in out, out
    assert not any(c in out for c in RAW), out
    assert "\nm\n" not in out and not any(line.startswith("\x01") for line in out.splitlines())


@pytest.mark.parametrize(
    "argv",
    [
        ["schedule", "add", HOSTILE, "--type", "t", "--cron", "@daily"],
        ["schedule", "suspend", HOSTILE],
        ["schedule", "resume", HOSTILE],
        ["schedule", "remove", HOSTILE],
        ["pause", HOSTILE],
        ["resume", HOSTILE],
        ["limit", "set", HOSTILE, "--concurrency", "2"],
        ["limit", "clear", HOSTILE],
    ],
)
def test_a_confirmation_escapes_the_name_it_repeats(capsys, monkeypatch, db_url, hostile,
                                                    argv) -> None:  # fmt: skip
    out = cli(capsys, monkeypatch, db_url, *argv)
    assert out.startswith(ESCAPED) or f": {ESCAPED}" in out, out
    assert not any(c in out for c in RAW), out


def test_json_output_keeps_the_exact_text(capsys, monkeypatch, db_url, hostile) -> None:
    [listed] = strict(cli(capsys, monkeypatch, db_url, "jobs", "list", "--json"))
    assert listed["type"] == listed["locked_by"] == listed["last_error"] == HOSTILE
    shown = strict(cli(capsys, monkeypatch, db_url, "jobs", "show", "1", "--json"))
    assert shown["steps"][0]["name"] == HOSTILE
    [limit] = strict(cli(capsys, monkeypatch, db_url, "limit", "list", "--json"))
    assert limit["type"] == HOSTILE
    schedules = strict(cli(capsys, monkeypatch, db_url, "schedule", "list", "--json"))
    assert HOSTILE in [s["name"] for s in schedules]
    status = strict(cli(capsys, monkeypatch, db_url, "status", "--json"))
    assert HOSTILE in status["types"]


def test_text_that_looks_like_a_time_is_shown_as_it_is(capsys, monkeypatch, db_url,
                                                       conn) -> None:  # fmt: skip
    rota.enqueue(conn, "2024-06-01T12:00", {}, key="2024-06-01T12:00:00.5Z")
    lines = cli(capsys, monkeypatch, db_url, "jobs", "show", "1").splitlines()
    assert ["type", "2024-06-01T12:00"] in [line.split() for line in lines]
    assert ["idempotency_key", "2024-06-01T12:00:00.5Z"] in [line.split() for line in lines]
    table = cli(capsys, monkeypatch, db_url, "jobs", "list")
    assert "2024-06-01T12:00 " in table and "2024-06-01T12:00:00" not in table


def test_json_output_is_strict_with_times_in_iso_8601(capsys, monkeypatch, db_url,
                                                      conn) -> None:  # fmt: skip
    rota.enqueue(conn, "t", {})
    conn.execute(
        "SET session_replication_role = replica;"
        " UPDATE rota.job SET timeout_seconds = 'NaN';"
        " INSERT INTO rota.job (type, run_at, timeout_seconds)"
        "     VALUES ('t', 'infinity', 'Infinity');"
        " RESET session_replication_role"
    )
    conn.execute(
        "INSERT INTO rota.schedule (name, job_type, cron, next_run_at)"
        " VALUES ('s', 't', '* * * * *', '2030-01-01T00:00:00Z')"
    )
    listed = strict(cli(capsys, monkeypatch, db_url, "jobs", "list", "--json"))
    assert [j["timeout_seconds"] for j in listed] == ["Infinity", "NaN"]
    assert listed[0]["run_at"] == "infinity"  # a time past Python's: its raw text
    assert "T" in listed[1]["run_at"] and "T" in listed[1]["created_at"]
    shown = strict(cli(capsys, monkeypatch, db_url, "jobs", "show", "1", "--json"))
    assert shown["timeout_seconds"] == "NaN" and "T" in shown["run_at"]
    schedules = strict(cli(capsys, monkeypatch, db_url, "schedule", "list", "--json"))
    assert {s["name"]: s["next_run_at"] for s in schedules}["s"] == "2030-01-01T00:00:00+00:00"


def test_jobs_show_prints_numbers_of_the_payload_as_stored(capsys, monkeypatch, db_url,
                                                           conn) -> None:  # fmt: skip
    rota.enqueue(conn, "t", {})
    stored = '{"big": 123456789012345678901234567890.5, "tiny": 1.5e-300}'
    conn.execute("UPDATE rota.job SET payload = %s::jsonb, result = %s::jsonb", (stored, stored))
    text = conn.execute("SELECT payload::text AS p FROM rota.job").fetchone()["p"]  # type: ignore[index]
    out = cli(capsys, monkeypatch, db_url, "jobs", "show", "1")
    assert "123456789012345678901234567890.5" in out and "e+29" not in out
    assert out.count(text) == 2 or "0.00000000000000000000" in out
    shown = strict(cli(capsys, monkeypatch, db_url, "jobs", "show", "1", "--json"))
    assert shown["payload"]["big"] > 1e29


def test_jobs_show_prints_the_unique_key(capsys, monkeypatch, db_url) -> None:
    for argv in (["--key", "K", "--unique-for", "60"], ["--key", "A", "--unique-active"]):
        cli(capsys, monkeypatch, db_url, "enqueue", "t", *argv)
    first = cli(capsys, monkeypatch, db_url, "jobs", "show", "1").splitlines()
    assert ["unique_key", "K"] in [line.split() for line in first]
    second = cli(capsys, monkeypatch, db_url, "jobs", "show", "2").splitlines()
    assert ["unique_key", "A"] in [line.split() for line in second]
    shown = strict(cli(capsys, monkeypatch, db_url, "jobs", "show", "1", "--json"))
    assert shown["unique_key"] == "K"


def test_jobs_show_reads_an_archived_job(
    conn: psycopg.Connection[Any],
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As rota.result and the console's job page do: an archived job is still
    # one `rota jobs show` away, marked as such (it said "no job with id").
    job_id = rota.enqueue(conn, "report", {"month": "2026-11"})
    conn.execute(
        "UPDATE rota.job SET status = 'done', attempts = 1, finished_at = now()"
        " - interval '30 days', result = '{\"pages\": 3}' WHERE id = %s",
        (job_id,),
    )
    Archiver(ArchiveSettings(done_retention_seconds=60)).run_once(conn)
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone() == {"n": 0}
    text = cli(capsys, monkeypatch, db_url, "jobs", "show", str(job_id))
    assert "archived" in text and "report" in text and "pages" in text
    shown = strict(cli(capsys, monkeypatch, db_url, "jobs", "show", str(job_id), "--json"))
    assert (shown["id"], shown["status"], shown["result"]) == (job_id, "done", {"pages": 3})
    assert shown["archived_at"]


@pytest.mark.parametrize(
    "setting",
    ["DateStyle=German", "DateStyle=SQL,DMY", "IntervalStyle=iso_8601", "client_encoding=LATIN1",
     "client_encoding=SQL_ASCII"],
)  # fmt: skip
def test_commands_read_and_write_whatever_the_sessions_styles(
    capsys, monkeypatch, db_url, setting
) -> None:
    # A role's, a database's or PGOPTIONS' settings reach every connection:
    # Rota's own read times and text as they are, whatever those say.
    url = f"{db_url} options='-c {setting}'"
    job_id = cli(capsys, monkeypatch, url, "enqueue", "€uro", "--delay", "60").strip()
    assert "€uro" in cli(capsys, monkeypatch, url, "jobs", "list")
    assert "€uro" in cli(capsys, monkeypatch, url, "jobs", "show", job_id)
    assert "€uro" in cli(capsys, monkeypatch, url, "status")
    cli(capsys, monkeypatch, url, "schedule", "add", "nightly", "--type", "€", "--cron", "@daily")
    assert "nightly" in cli(capsys, monkeypatch, url, "schedule", "list")


def test_a_read_only_database_is_said_to_take_no_writes_not_to_be_unreachable(
    capsys, monkeypatch, db_url
) -> None:
    monkeypatch.setenv(
        "ROTA_DATABASE_URL", f"{db_url} options='-c default_transaction_read_only=on'"
    )
    assert main(["enqueue", "t"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rota: the database takes no writes now"), err
    assert "cannot reach" not in err


def test_a_callers_connection_in_another_datestyle_gets_a_database_error(db_url) -> None:
    # The caller's connection is used as it is: a reader says why it cannot read.
    with psycopg.connect(db_url, autocommit=True) as conn:
        job_id = rota.enqueue(conn, "t")
        conn.execute("SET DateStyle = German")
        with pytest.raises(rota.DatabaseError, match="SET DateStyle = ISO"):
            rota.lookup.get_job(conn, job_id)
