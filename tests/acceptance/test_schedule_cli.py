"""`rota schedule ...` and `rota archive` as scripts use them."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import psycopg
import pytest

from tests.acceptance.procs import rota

Conn = psycopg.Connection[Any]


def schedule_count(conn: Conn) -> int:
    return conn.execute("SELECT count(*) AS n FROM rota.schedule").fetchone()["n"]  # type: ignore[index]


def test_add_list_suspend_resume_remove(db_url: str, conn: Conn) -> None:
    added = rota(db_url, "schedule", "add", "reports", "--type", "report.build",
                 "--cron", "30 2 * * *", "--timezone", "Europe/Berlin",
                 "--payload", '{"kind": "daily"}', "--max-attempts", "3",
                 "--spread-seconds", "60", "--concurrency-policy", "Forbid",
                 "--starting-deadline-seconds", "600")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("reports: next run ")
    listed = rota(db_url, "schedule", "list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split()[:5] == ["NAME", "TYPE", "CRON", "TIMEZONE", "SUSPEND"]
    line = next(li for li in lines if li.startswith("reports"))
    assert "Europe/Berlin" in line and "02:30:00+0" in line and "+00:00" in line
    rows = json.loads(rota(db_url, "schedule", "list", "--json").stdout)
    row = next(r for r in rows if r["name"] == "reports")
    assert (row["payload"], row["spread_seconds"], row["concurrency_policy"]) == (
        {"kind": "daily"}, 60, "Forbid"
    )  # fmt: skip
    assert rota(db_url, "schedule", "suspend", "reports").stdout == "reports: suspended\n"
    assert conn.execute("SELECT suspend FROM rota.schedule WHERE name = 'reports'").fetchone() == {
        "suspend": True
    }
    assert "resumed, next run" in rota(db_url, "schedule", "resume", "reports").stdout
    assert rota(db_url, "schedule", "remove", "reports").returncode == 0
    gone = rota(db_url, "schedule", "remove", "reports")
    assert gone.returncode == 2 and "no schedule named 'reports'" in gone.stderr
    assert schedule_count(conn) == 1  # the built-in rota/archive


def test_add_with_unique_for_or_unique_active(db_url: str, conn: Conn) -> None:
    for flags in (["--unique-for", "3600"], ["--unique-active"]):
        added = rota(db_url, "schedule", "add", "u", "--type", "t", "--cron", "@hourly", *flags)
        assert added.returncode == 0, added.stderr
        row = conn.execute(
            "SELECT unique_for_seconds, unique_active FROM rota.schedule WHERE name = 'u'"
        ).fetchone()
        assert row == {
            "unique_for_seconds": 3600.0 if flags[0] == "--unique-for" else None,
            "unique_active": flags[0] == "--unique-active",
        }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "61 * * * *"], "invalid cron expression '61 * * * *'"),
        (["--cron", "* * * *"], "expected 5 fields"),
        (["--cron", "garbage"], "invalid cron expression 'garbage': expected 5 fields, got 1"),
        (["--cron", "0" * 1017 + " * * * *"], "cron expression is 1025 bytes long"),
        (["--cron", "0 * * * *", "--group", ""], "a group must be a non-empty string, not ''"),
        (["--cron", "@reboot"], "unknown macro"),
        (["--cron", "0 * * * *", "--timezone", "Europe/Atlantis"], "unknown time zone"),
        (["--cron", "0 * * * *", "--payload", "{bad"], "not valid JSON"),
        (["--cron", "0 * * * *", "--spread-seconds", "-5"], "argument --spread-seconds"),
        (["--cron", "0 * * * *", "--starting-deadline-seconds", "0"], "--starting-deadline"),
        (["--cron", "0 * * * *", "--concurrency-policy", "Replace"], "invalid choice"),
        (["--cron", "0 * * * *", "--unique-for", "0"], "more than 0"),
        (["--cron", "0 * * * *", "--unique-for", "5", "--unique-active"], "not allowed with"),
    ],
)
def test_bad_schedule_is_exit_2_one_line_nothing_stored(
    db_url: str, conn: Conn, args: list[str], message: str
) -> None:
    result = rota(db_url, "schedule", "add", "x", "--type", "t", *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    assert schedule_count(conn) == 1


def test_an_archive_schedule_takes_only_a_payload_the_archiver_takes(
    db_url: str, conn: Conn
) -> None:
    def add(payload: str) -> subprocess.CompletedProcess[str]:
        return rota(db_url, "schedule", "add", "rota/archive", "--type", "rota.archive",
                    "--cron", "*/5 * * * *", "--payload", payload)  # fmt: skip

    def stored() -> object:
        row = conn.execute("SELECT payload FROM rota.schedule WHERE name = 'rota/archive'")
        return row.fetchone()["payload"]  # type: ignore[index]

    before = stored()
    for payload, reason in [
        ('{"done_retention_seconds": "7d"}', "done_retention_seconds must be a number of seconds"),
        ('{"batch_size": 0}', "at least 1"),
        ('{"archive_retention_seconds": -60}', "must not be negative"),
        ('{"retention": 60}', "takes only the keys"),
    ]:
        result = add(payload)
        assert result.returncode == 2, payload
        assert len(result.stderr.strip().splitlines()) == 1
        assert "payload of a rota.archive schedule" in result.stderr and reason in result.stderr
        assert stored() == before
    assert add('{"archive_retention_seconds": 7776000}').returncode == 0
    assert stored() == {"archive_retention_seconds": 7776000}


def test_preview_shows_dst_days_in_the_schedule_zone(db_url: str) -> None:
    fall = rota(db_url, "schedule", "preview", "--cron", "0 * * * *", "--timezone",
                "Europe/Berlin", "--from", "2026-10-25T01:30:00+02:00", "--count", "3")  # fmt: skip
    assert fall.returncode == 0, fall.stderr
    assert fall.stdout.splitlines() == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    spring = rota(db_url, "schedule", "preview", "--cron", "30 2 * * *", "--timezone",
                  "Europe/Berlin", "--from", "2026-03-28T00:00:00Z", "--count", "3")  # fmt: skip
    assert spring.stdout.splitlines() == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    bad = rota(db_url, "schedule", "preview", "--cron", "0 0 30 2 *")
    assert bad.returncode == 2 and "never fires" in bad.stderr


def test_archive_command(db_url: str, conn: Conn) -> None:
    conn.execute(
        "INSERT INTO rota.job (type, status, finished_at)"
        " SELECT 't', 'done', now() - interval '2 days' FROM generate_series(1, 5)"
        " UNION ALL SELECT 't', 'dead', now() - interval '2 days'"
    )
    kept = rota(db_url, "archive")
    assert kept.stdout == "archived 0 done and 0 failed/dead jobs\n"
    moved = rota(db_url, "archive", "--older-than", "1d")
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout == "archived 5 done and 0 failed/dead jobs\n"
    bad = rota(db_url, "archive", "--older-than", "soon")
    assert bad.returncode == 2 and "duration" in bad.stderr


def test_archive_command_deletes_old_archived_rows(db_url: str, conn: Conn) -> None:
    conn.execute(
        "INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts,"
        " max_attempts, created_at, archived_at)"
        " SELECT -g, 't', '{}', 'done', now(), 1, 3, now(), now() - interval '100 days'"
        " FROM generate_series(1, 5) AS g"
    )
    for older_than, deleted in [("120d", 0), ("90d", 5)]:
        done = rota(db_url, "archive", "--delete-archived-older-than", older_than)
        assert done.returncode == 0, done.stderr
        lines = ["archived 0 done and 0 failed/dead jobs", f"deleted {deleted} archived jobs"]
        assert done.stdout.splitlines() == lines
    bad = rota(db_url, "archive", "--delete-archived-older-than", "later")
    assert bad.returncode == 2 and "--delete-archived-older-than" in bad.stderr
    archived = conn.execute("SELECT count(*) AS n FROM rota.job_archive").fetchone()
    assert archived is not None and archived["n"] == 0
