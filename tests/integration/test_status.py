"""`rota status`: the measures as a table or JSON, the warnings, and `--watch`."""

from __future__ import annotations

import json

import pytest

from rota.cli import main
from rota.cli.status import watch
from rota.migrate import use_key_index
from rota.status import format_age


@pytest.fixture
def busy_db(conn, db_url, monkeypatch):
    """A queue with a backlog, a dead job, many lease expirations and a missed slot."""
    conn.execute(
        "INSERT INTO rota.job (type, status, run_at) VALUES"
        " ('email.send', 'ready', now() - interval '10 minutes'),"
        " ('email.send', 'running', now()), ('email.send', 'done', now()),"
        " ('report', 'dead', now()), ('report', 'ready', now() + interval '1 hour')"
    )
    conn.execute("INSERT INTO rota.lease_expiration VALUES (date_trunc('hour', now(), 'UTC'), 12)")
    conn.execute(
        "INSERT INTO rota.schedule (name, job_type, cron, next_run_at, missed_slots)"
        " VALUES ('ns/nightly', 'report', '0 3 * * *', now(), 2)"
    )
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    return db_url


def test_json_has_the_measures_and_warnings(busy_db, capsys):
    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["types"]["email.send"]["ready"] == 1
    assert status["types"]["email.send"]["oldest_ready_age_seconds"] >= 600
    assert status["types"]["report"] == {
        "ready": 1,
        "due": 0,
        "oldest_ready_age_seconds": 0.0,
        "running": 0,
        "waiting": 0,
        "done": 0,
        "failed": 0,
        "dead": 1,
        "cancelled": 0,
        "paused": False,
        "held": 0,
        "limited": False,
    }
    assert status["dead_jobs"] == 1
    assert status["lease_expirations"]["current_hour"] == 12
    assert len(status["warnings"]) == 3


def test_table_shows_each_type_and_every_warning(busy_db, capsys):
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    header, email, report = out.splitlines()[2:5]
    assert header.split() == [
        "TYPE",
        "READY",
        "DUE",
        "OLDEST",
        "READY",
        "RUNNING",
        "WAITING",
        "DONE",
        "FAILED",
        "DEAD",
        "CANCELLED",
        "STATE",
    ]
    assert email.split()[:3] == ["email.send", "1", "1"] and email.split()[4:] == [
        "1",
        "0",
        "1",
        "0",
        "0",
        "0",
        "active",
    ]
    assert report.split() == ["report", "1", "0", "-", "0", "0", "0", "0", "1", "0", "active"]
    assert "email.send: the oldest ready job has waited 10m" in out
    assert "12 leases expired within one hour (threshold 10)" in out
    assert "1 dead job(s)" in out
    assert "ns/nightly" in out


def test_thresholds_are_flags(busy_db, capsys):
    assert main(["status", "--json", "--max-age", "1h", "--max-lease-expirations", "13"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == [
        "1 dead job(s): `rota dead list` shows them, `rota dead retry` runs them again"
    ]


def test_an_empty_queue_has_no_warnings(db_url, monkeypatch, capsys):
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["status"]) == 0
    assert "No warnings." in capsys.readouterr().out


def test_it_says_how_idempotency_keys_are_kept_unique(conn, db_url, monkeypatch, capsys):
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["status"]) == 0
    assert (
        "Idempotency keys: unique constraint job_idempotency_key_key\n" in capsys.readouterr().out
    )
    use_key_index(db_url, "partial")
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key_index"] == "partial"
    # No unique index at all (a switch undone by hand): said, and warned about.
    conn.execute("DROP INDEX rota.job_idempotency_key_idx")
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "Idempotency keys: none\n" in out
    assert "! rota.job has no unique index on idempotency_key" in out
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key_index"] is None


def test_watch_redraws_each_round(busy_db, capsys):
    snapshots = iter([{"n": 1}, {"n": 2}])
    assert watch(lambda: next(snapshots), 0.001, as_json=True, rounds=2) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"n": 1},
        {"n": 2},
    ]


@pytest.mark.parametrize("argv", [["--watch", "0"], ["--watch", "soon"], ["--max-age", "x"]])
def test_bad_flags_exit_2(argv, db_url, monkeypatch, capsys):
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["status", *argv]) == 2
    assert capsys.readouterr().err.startswith("rota: error:")


def test_ages_read_short():
    assert [format_age(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]
