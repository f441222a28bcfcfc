"""Least privilege: the schema owner migrates, the runtime runs as a role that cannot change it.

`rota migrate --grant ROLE` gives an existing role the rights that workers,
schedulers, reapers, the archiver, the operator and the console need. The tests
create a LOGIN role on the test server, run all of those as it (a real
`rota worker` process among them), and show that it cannot alter, add or drop
anything in the schema.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

import rota
from rota import claim, grants, lookup
from rota import schedule_store as schedules
from rota.archive import Archiver, ArchiveSettings
from rota.claim import Attempt
from rota.cli import main
from rota.errors import InvalidInput
from rota.jobs import Outcome, Status
from rota.migrate import migrate
from rota.reaper import Reaper
from rota.schedule_store import ScheduleSpec
from rota.scheduler import Scheduler
from rota.status import read_status
from tests.acceptance.procs import WorkerProcess, wait_for

_counter = itertools.count()


class Role:
    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url


@pytest.fixture
def app_role(db_url: str) -> Iterator[Role]:
    """A fresh LOGIN role with no rights of its own, able to connect to the test's database."""
    name = f"rota_app_{os.getpid()}_{next(_counter)}"
    password = secrets.token_hex(8)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEROLE PASSWORD {}").format(
                pgsql.Identifier(name), pgsql.Literal(password)
            )
        )
    try:
        yield Role(name, make_conninfo(db_url, user=name, password=password))
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            # Its privileges (and default privileges) in this database go first.
            conn.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(name)))
            conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


def grant(monkeypatch: pytest.MonkeyPatch, owner_url: str, *args: str) -> int:
    monkeypatch.setenv("ROTA_DATABASE_URL", owner_url)
    return main(["migrate", *args])


def as_role(role: Role) -> psycopg.Connection[Any]:
    return psycopg.connect(role.url, autocommit=True, row_factory=dict_row)  # type: ignore[arg-type]


def test_before_the_grant_the_role_can_do_nothing(app_role: Role) -> None:
    with as_role(app_role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT count(*) FROM rota.job")


def test_a_granted_role_runs_workers_schedulers_reapers_and_the_console(
    app_role: Role, db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert grant(monkeypatch, db_url, "--grant", app_role.name) == 0

    # Enqueue and a real worker (with its own reaper and scheduler loops) as the role.
    ids = [rota.enqueue(app_role.url, "noop", {"n": n}) for n in range(5)]
    worker = WorkerProcess(app_role.url, "--poll-interval", "0.2", log=tmp_path / "worker.log")
    try:
        wait_for(
            lambda: all(lookup.get_job(app_role.url, i).status == "done" for i in ids),
            timeout=90,
            what="the worker running as the role to finish every job",
        )
    finally:
        assert worker.stop() == 0, worker.output()
    assert "permission denied" not in worker.output(), worker.output()

    now = datetime.now(UTC)
    with as_role(app_role) as conn:
        # The claim functions, directly: claim, extend, finish.
        job_id = rota.enqueue(conn, "direct")
        (job,) = claim.claim(conn, "w1", 1, 30, types=["direct"])
        leases = claim.extend_leases(conn, "w1", [(job.id, job.attempts)], 30)
        assert [lease.job_id for lease in leases] == [job_id]
        written = claim.write_outcomes(conn, "w1", [Attempt.of(job, Outcome.DONE)])
        assert list(written.values()) == [Status.DONE]

        # A lease that ran out is reaped.
        rota.enqueue(conn, "abandoned")
        claim.claim(conn, "w2", 1, 1, types=["abandoned"])
        reaped = Reaper().run_once(conn, now=now + timedelta(minutes=5))
        assert reaped.count == 1

        # Schedules as the operator and the CLI write them; the scheduler fires one.
        spec = ScheduleSpec(name="hourly", job_type="tick", cron="0 * * * *")
        schedules.upsert(conn, spec, now=now - timedelta(hours=2))
        assert Scheduler().run_once(conn, now=now).count >= 1
        assert schedules.set_suspended(conn, "hourly", True) is not None

        # The console's measures, and the archiver moving finished jobs.
        assert read_status(conn).types["noop"].done == 5
        settings = ArchiveSettings(done_retention_seconds=0, failed_retention_seconds=0)
        assert Archiver(settings).run_once(conn, now=now + timedelta(days=1)).done >= 6
        pruning = ArchiveSettings(archive_retention_seconds=0)
        assert Archiver(pruning).run_once(conn, now=now + timedelta(days=2)).deleted >= 6
        assert schedules.remove(conn, "hourly")


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE rota.job ADD COLUMN extra integer",
        "CREATE TABLE rota.extra (id integer)",
        "DROP TABLE rota.job_archive",
        "DROP FUNCTION rota.notify_ready_jobs() CASCADE",
        "TRUNCATE rota.job",
        "CREATE INDEX job_extra_idx ON rota.job (type)",
        "INSERT INTO rota.migrations (id, name) VALUES (9999, 'sneaked_in')",
        "DELETE FROM rota.migrations",
    ],
)
def test_a_granted_role_cannot_change_the_schema(
    app_role: Role, db_url: str, monkeypatch: pytest.MonkeyPatch, statement: str
) -> None:
    assert grant(monkeypatch, db_url, "--grant", app_role.name) == 0
    with as_role(app_role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)
        # It may read which migrations are applied (the runtime checks that at start).
        assert conn.execute("SELECT count(*) AS n FROM rota.migrations").fetchone()["n"] >= 3  # type: ignore[index]
    with psycopg.connect(db_url) as owner:
        owns = owner.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'rota' AND pg_get_userbyid(c.relowner) = %s",
            (app_role.name,),
        ).fetchone()
        can_create = owner.execute(
            "SELECT has_schema_privilege(%s, 'rota', 'CREATE')", (app_role.name,)
        ).fetchone()
    assert owns == (0,)
    assert can_create == (False,)


def test_tables_of_later_migrations_are_covered(
    app_role: Role, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert grant(monkeypatch, db_url, "--grant", app_role.name) == 0
    with psycopg.connect(db_url, autocommit=True) as owner:
        # What a later migration does, as the schema owner: the default privileges cover it.
        owner.execute("CREATE TABLE rota.added_later (id bigserial PRIMARY KEY, note text)")
    with as_role(app_role) as conn:
        conn.execute("INSERT INTO rota.added_later (note) VALUES ('default privileges')")
    with psycopg.connect(db_url, autocommit=True) as owner:
        # Rights taken away (or an object made by another owner): granting again restores them.
        owner.execute(
            pgsql.SQL("REVOKE ALL ON rota.added_later, rota.added_later_id_seq FROM {}").format(
                pgsql.Identifier(app_role.name)
            )
        )
    with as_role(app_role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("INSERT INTO rota.added_later (note) VALUES ('revoked')")
    assert grant(monkeypatch, db_url, f"--grant={app_role.name}") == 0
    with as_role(app_role) as conn:
        conn.execute("INSERT INTO rota.added_later (note) VALUES ('granted again')")
        count = conn.execute("SELECT count(*) AS n FROM rota.added_later").fetchone()
    assert count == {"n": 2}


def test_several_roles_in_one_flag_or_many(
    app_role: Role, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(pgsql.SQL("CREATE ROLE {}").format(pgsql.Identifier(app_role.name + "_b")))
    try:
        args = ["--grant", f"{app_role.name}, {app_role.name}_b", "--grant", app_role.name]
        assert grant(monkeypatch, db_url, *args) == 0
        with psycopg.connect(db_url) as owner:
            rows = owner.execute(
                "SELECT has_table_privilege(r, 'rota.job', 'UPDATE') FROM unnest(%s::text[]) r",
                ([app_role.name, app_role.name + "_b"],),
            ).fetchall()
        assert rows == [(True,), (True,)]
    finally:
        with psycopg.connect(db_url, autocommit=True) as owner:
            owner.execute(
                pgsql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(
                    pgsql.Identifier(app_role.name + "_b")
                )
            )


@pytest.mark.parametrize(
    "value", ["no_such_role", "", " , ", "public", "pg_read_all_data", "pg_monitor"]
)
def test_an_unknown_role_is_exit_2_and_changes_nothing(
    empty_db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    value: str,
) -> None:
    assert grant(monkeypatch, empty_db_url, "--grant", value) == 2
    err = capsys.readouterr().err
    assert err.startswith("rota: error: ") and err.count("\n") == 1, err
    with psycopg.connect(empty_db_url) as conn:
        schema = conn.execute("SELECT to_regnamespace('rota')").fetchone()
    assert schema == (None,)  # not even the migrations ran


def test_a_predefined_role_is_refused_before_anything_changes(db_url: str) -> None:
    # pg_read_all_data exists: granting Rota's runtime rights to it would let every
    # member of a read-only role write to the queue.
    with psycopg.connect(db_url, autocommit=True) as owner:
        before = owner.execute(
            "SELECT has_table_privilege('pg_read_all_data', 'rota.job', 'INSERT')"
        ).fetchone()
        with pytest.raises(InvalidInput, match="predefined role"):
            migrate(owner, grant=["pg_read_all_data"])
        with pytest.raises(InvalidInput, match="must be a list"):
            migrate(owner, grant="rota_worker")  # a bare string is not its characters
        after = owner.execute(
            "SELECT has_table_privilege('pg_read_all_data', 'rota.job', 'INSERT')"
        ).fetchone()
    assert before == after == (False,)


def test_a_run_after_one_that_died_before_its_grants_takes_execute_from_public(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL lets PUBLIC execute every new function. A migrate that died
    # after its migrations committed but before its grants left them so; the
    # next run, with nothing to apply and no role named, takes that back.
    class Died(Exception):
        pass

    def die(*_: object) -> None:
        raise Died

    with monkeypatch.context() as patch:
        patch.setattr(grants, "apply", die)
        with pytest.raises(Died):
            migrate(empty_db_url)
    assert migrate(empty_db_url) == []
    with psycopg.connect(empty_db_url) as conn:
        public = conn.execute(
            "SELECT oid::regprocedure::text FROM pg_proc"
            " WHERE pronamespace = 'rota'::regnamespace"
            " AND (proacl IS NULL OR EXISTS (SELECT FROM aclexplode(proacl) AS a"
            "      WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))"
        ).fetchall()
    assert public == []
