"""`rota limit ...`, the flow-control flags of `rota enqueue`, and `rota status`
showing what a limit holds back."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import rota
from rota.claim import claim
from tests.acceptance.procs import rota as run


def test_limit_set_list_clear(db_url: str) -> None:
    done = run(db_url, "limit", "set", "payment", "--concurrency", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "payment: concurrency 5"
    done = run(db_url, "limit", "set", "email", "--rate", "100", "--per", "60")
    assert done.stdout.strip() == "email: 100 per 60s"
    listed = run(db_url, "limit", "list", "--json")
    assert [(d["type"], d["concurrency"], d["rate"]) for d in json.loads(listed.stdout)] == [
        ("email", None, 100),
        ("payment", 5, None),
    ]
    assert run(db_url, "limit", "clear", "payment").stdout.strip() == "payment: limits cleared"
    assert run(db_url, "limit", "clear", "payment").stdout.strip() == "payment: had no limits"
    table = run(db_url, "limit", "list").stdout
    assert "email" in table and "payment" not in table


@pytest.mark.parametrize(
    "args",
    [
        ["limit", "set", "t"],
        ["limit", "set", "t", "--concurrency", "0"],
        ["limit", "set", "t", "--concurrency", "x"],
        ["limit", "set", "t", "--rate", "5"],
        ["limit", "set", "t", "--per", "5"],
        ["limit", "set", "t", "--rate", "5", "--per", "-1"],
        ["limit", "set", "*", "--concurrency", "1"],
        ["limit"],
        ["enqueue", "t", "--unique-for", "60"],
        ["enqueue", "t", "--key", "k", "--unique-for", "0"],
        ["enqueue", "t", "--key", "k", "--unique-for", "5", "--unique-active"],
        ["enqueue", "t", "--group", ""],
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    db_url: str, conn: psycopg.Connection[Any], args: list[str]
) -> None:
    done = run(db_url, *args)
    assert done.returncode == 2, done
    assert len(done.stderr.strip().splitlines()) == 1 and "error" in done.stderr
    assert rota.list_limits(conn) == []
    assert conn.execute("SELECT count(*) AS n FROM rota.job").fetchone()["n"] == 0  # type: ignore[index]


def test_enqueue_with_a_group_and_unique_keys(db_url: str, conn: psycopg.Connection[Any]) -> None:
    job = run(db_url, "enqueue", "export", "--group", "customer-9")
    row = conn.execute("SELECT group_key FROM rota.job WHERE id = %s", (int(job.stdout),))
    assert row.fetchone() == {"group_key": "customer-9"}
    first = run(db_url, "enqueue", "refresh", "--key", "acct-1", "--unique-for", "3600")
    again = run(db_url, "enqueue", "refresh", "--key", "acct-1", "--unique-for", "3600")
    assert first.stdout == again.stdout
    active = run(db_url, "enqueue", "sync", "--key", "acct-1", "--unique-active")
    assert run(db_url, "enqueue", "sync", "--key", "acct-1", "--unique-active").stdout == (
        active.stdout
    )


def test_status_shows_what_a_limit_holds_back(db_url: str, conn: psycopg.Connection[Any]) -> None:
    rota.enqueue_many(conn, [rota.NewJob("payment") for _ in range(8)])
    rota.set_limit(conn, "payment", concurrency=5)
    assert len(claim(conn, "w", 10, 30)) == 5
    text = run(db_url, "status").stdout
    type_row = next(row for row in text.splitlines() if row.startswith("payment "))
    assert type_row.split()[-1] == "LIMITED"
    [limits_row] = [row for row in text.splitlines() if "concurrency 5" in row]
    assert limits_row.split()[-2:] == ["5", "3"]  # running, held back
    status = json.loads(run(db_url, "status", "--json").stdout)
    assert status["types"]["payment"]["limited"] is True
    assert status["limits"][0]["held"] == 3
