"""A migration waiting for a table's lock does not stop the queue.

PostgreSQL queues every later lock request behind a waiting one: a migration's
ALTER TABLE waiting for a long transaction that read rota.job (a dashboard, a
psql session left open) would stop every claim and enqueue until that
transaction ends. A migration gives up the lock after a moment, says which
table it waited for, and tries again; after a bounded number of tries it stops
with nothing of that migration applied.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import rota
from rota import sql
from rota.cli import main
from rota.migrate import applied, migrate
from tests.acceptance.procs import wait_for

migrations = importlib.import_module("rota.migrate")

LOCKING = 41
"""A migration that alters rota.job (it adds the claims column)."""


@pytest.fixture
def before_locking(empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database migrated up to the migration before LOCKING."""
    known = sql.migrations()
    with monkeypatch.context() as patch:
        patch.setattr(sql, "migrations", lambda: [m for m in known if m[0] < LOCKING])
        migrate(empty_db_url)
    return empty_db_url


@pytest.fixture
def reader(before_locking: str) -> Iterator[psycopg.Connection[Any]]:
    """A transaction that read rota.job and stays open until the test ends it."""
    with psycopg.connect(before_locking) as conn:
        conn.execute("SELECT count(*) FROM rota.job")
        yield conn


def waiting_for_job_table(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT EXISTS (SELECT FROM pg_locks"
            " WHERE relation = 'rota.job'::regclass AND NOT granted) AS waiting"
        ).fetchone()
    return bool(row and row[0])


def test_jobs_are_enqueued_while_a_migration_waits_for_a_reader(
    before_locking: str, reader: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate(before_locking)
        except BaseException as exc:
            errors.append(exc)

    migrating = threading.Thread(target=run)
    with caplog.at_level("WARNING", logger="rota.migrate"):
        migrating.start()
        try:
            wait_for(
                lambda: waiting_for_job_table(before_locking),
                timeout=60,
                what="the migration to wait for the reader's lock on rota.job",
            )
            # Without a lock timeout this enqueue waits behind the migration
            # until the reader ends: the statement timeout fails the test.
            with psycopg.connect(before_locking, options="-c statement_timeout=30s") as app:
                rota.enqueue(app, "t", {})
            wait_for(
                lambda: any("rota.job" in r.getMessage() for r in caplog.records),
                timeout=60,
                what="the migration to say which table it waits for",
            )
        finally:
            reader.rollback()
            migrating.join(120)
    assert not migrating.is_alive()
    assert errors == []
    assert applied(before_locking) == [n for n, _, _ in sql.migrations()]


def test_a_migration_that_cannot_lock_a_table_stops_with_nothing_of_it_applied(
    before_locking: str,
    reader: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(migrations, "_MIGRATION_LOCK_TRIES", 2)
    monkeypatch.setenv("ROTA_DATABASE_URL", before_locking)
    assert main(["migrate"]) == 1
    said = capsys.readouterr().err.splitlines()[-1]  # after the log of each try
    assert said.startswith(f"rota: migration {LOCKING:04d}") and "lock rota.job" in said, said
    assert applied(before_locking) == [n for n, _, _ in sql.migrations() if n < LOCKING]
    with psycopg.connect(before_locking) as conn:
        column = conn.execute(
            "SELECT count(*) FROM pg_attribute"
            " WHERE attrelid = 'rota.job'::regclass AND attname = 'claims'"
        ).fetchone()
    assert column == (0,)
    reader.rollback()
    assert migrate(before_locking) == [n for n, _, _ in sql.migrations() if n >= LOCKING]
