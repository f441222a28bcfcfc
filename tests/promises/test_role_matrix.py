"""Least privilege as a matrix: each kind of grant, tried on every table and function.

`rota migrate --grant-worker / --grant / --grant-enqueue / --grant-read ROLE`
each give a role exactly the list in docs/operations.md. The test connects as
a role of each kind and tries SELECT, INSERT, UPDATE and DELETE on every table
of schema rota (in a transaction rolled back) and EXECUTE on every function;
what works must be exactly the documented list, nothing more or less.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

import rota
from rota.cli import main
from rota.errors import DatabaseError
from rota.status import read_status
from rota.web import overview, reads
from rota.web.filters import JobFilter

_counter = itertools.count()
ALL = frozenset("SIUD")
CONSOLE_TABLES = {"audit", "web_session"}


def _tables(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = 'rota'::regnamespace"
        " AND relkind IN ('r', 'p') ORDER BY relname"
    ).fetchall()
    return [r["relname"] for r in rows]


def _functions(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text AS f FROM pg_proc p"
        " WHERE p.pronamespace = 'rota'::regnamespace ORDER BY 1"
    ).fetchall()
    return [r["f"] for r in rows]


def expected_tables(kind: str, table: str) -> frozenset[str]:
    """The documented list (docs/operations.md, Least privilege in the database)."""
    if kind == "worker":
        if table in CONSOLE_TABLES:
            return frozenset()
        return frozenset("S") if table == "migrations" else ALL
    if kind == "runtime":
        extra = {"audit": frozenset("SI"), "web_session": frozenset("SID")}
        return extra.get(table) or expected_tables("worker", table)
    if kind == "read":
        return frozenset() if table == "web_session" else frozenset("S")
    return frozenset()  # enqueue


def expected_function(kind: str, signature: str) -> bool:
    if kind in ("worker", "runtime"):
        return True
    if kind == "enqueue":
        return signature.startswith(("rota.enqueue(", "rota.emit("))
    return False


_TRIES = {
    "S": "SELECT FROM rota.{t} LIMIT 0",
    "I": "INSERT INTO rota.{t} DEFAULT VALUES",
    "U": "UPDATE rota.{t} SET {c} = DEFAULT WHERE false",
    "D": "DELETE FROM rota.{t} WHERE false",
}


def _can(conn: psycopg.Connection[Any], what: str, table: str, column: str) -> bool:
    statement = pgsql.SQL(_TRIES[what]).format(  # type: ignore[arg-type]
        t=pgsql.Identifier(table), c=pgsql.Identifier(column)
    )
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return False
    except psycopg.Error:
        return True  # past the privilege check (a NOT NULL column, say)
    return True


class Roles:
    """A fresh LOGIN role per kind of grant: its name and the URL to connect as it."""

    KINDS = ("worker", "runtime", "enqueue", "read")
    FLAGS = {
        "worker": "--grant-worker",
        "runtime": "--grant",
        "enqueue": "--grant-enqueue",
        "read": "--grant-read",
    }

    def __init__(self, db_url: str) -> None:
        self.names: dict[str, str] = {}
        self.urls: dict[str, str] = {}
        with psycopg.connect(db_url, autocommit=True) as owner:
            for kind in self.KINDS:
                name = f"rota_{kind}_{os.getpid()}_{next(_counter)}"
                password = secrets.token_hex(8)
                owner.execute(
                    pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        pgsql.Identifier(name), pgsql.Literal(password)
                    )
                )
                self.names[kind] = name
                self.urls[kind] = make_conninfo(db_url, user=name, password=password)

    def connect(self, kind: str) -> psycopg.Connection[Any]:
        return psycopg.connect(self.urls[kind], autocommit=True, row_factory=dict_row)  # type: ignore[arg-type]


@pytest.fixture
def roles(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Roles]:
    """Each role granted its kind by `rota migrate`, as an owner would run it."""
    made = Roles(db_url)
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    args = [arg for kind in Roles.KINDS for arg in (Roles.FLAGS[kind], made.names[kind])]
    try:
        assert main(["migrate", *args]) == 0
        yield made
    finally:
        with psycopg.connect(db_url, autocommit=True) as owner:
            for name in made.names.values():
                owner.execute(
                    pgsql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(pgsql.Identifier(name))
                )


@pytest.mark.parametrize("kind", Roles.KINDS)
def test_each_kind_can_do_exactly_its_documented_list(
    roles: Roles, conn: psycopg.Connection[Any], kind: str
) -> None:
    tables = _tables(conn)
    columns = {
        r["t"]: r["c"]
        for r in conn.execute(
            "SELECT DISTINCT ON (attrelid) attrelid::regclass::text AS t, attname AS c"
            " FROM pg_attribute WHERE attrelid::regclass::text LIKE 'rota.%%'"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attrelid, attnum"
        )
    }
    functions = _functions(conn)
    wrong = []
    with roles.connect(kind) as role:
        for table in tables:
            can = frozenset(w for w in "SIUD" if _can(role, w, table, columns[f"rota.{table}"]))
            if can != expected_tables(kind, table):
                wrong.append(
                    f"{table}: {''.join(sorted(can))} (documented:"
                    f" {''.join(sorted(expected_tables(kind, table)))})"
                )
        for function in functions:
            row = role.execute(
                "SELECT has_function_privilege(%s, 'EXECUTE') AS can", (function,)
            ).fetchone()
            if row["can"] != expected_function(kind, function):  # type: ignore[index]
                wrong.append(f"{function}: {'can' if row['can'] else 'cannot'} execute")  # type: ignore[index]
    assert wrong == []


def test_the_enqueue_role_enqueues_through_the_function_and_reads_nothing(
    roles: Roles, conn: psycopg.Connection[Any]
) -> None:
    with roles.connect("enqueue") as role:
        job_id = role.execute("SELECT rota.enqueue('email.send', '{\"to\": 1}') AS id").fetchone()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            role.execute("SELECT payload FROM rota.job")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            role.execute("UPDATE rota.job SET status = 'done'")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="run_at must be"):
            role.execute("SELECT rota.enqueue('t', run_at => 'infinity')")
    assert job_id is not None
    [row] = conn.execute("SELECT id, type FROM rota.job").fetchall()
    assert row == {"id": job_id["id"], "type": "email.send"}


def test_the_enqueue_function_cannot_be_steered_by_the_caller_s_search_path(
    roles: Roles, conn: psycopg.Connection[Any]
) -> None:
    with roles.connect("enqueue") as role:
        # An object of the caller's own that shadows a built-in function the
        # body calls (coalesce is syntax; now() is a function) is never reached.
        role.execute(
            "CREATE FUNCTION pg_temp.now() RETURNS timestamptz"
            " LANGUAGE sql AS $$ SELECT 'infinity'::timestamptz $$"
        )
        role.execute("SET search_path = pg_temp, public")
        role.execute("SELECT rota.enqueue('t')")
    [row] = conn.execute("SELECT run_at < 'infinity' AS sane FROM rota.job").fetchall()
    assert row == {"sane": True}


def test_the_read_role_serves_status_and_the_console_s_pages(
    roles: Roles, conn: psycopg.Connection[Any]
) -> None:
    job_id = rota.enqueue(conn, "t", {"n": 1})
    with roles.connect("read") as role:
        assert read_status(role).types["t"].ready == 1
        overview.read(role)
        page = reads.job_page(role, JobFilter(), None, 50)
        assert [row["id"] for row in page.rows] == [job_id]
        assert reads.job_detail(role, job_id).job.id == job_id
        reads.schedules(role)
        reads.audit_page(role, None, 50)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            role.execute("SELECT rota.enqueue('t')")


def test_a_role_moved_to_another_kind_keeps_nothing_of_the_old(
    roles: Roles, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    assert main(["migrate", "--grant-read", roles.names["worker"]]) == 0
    with roles.connect("worker") as role:
        role.execute("SELECT count(*) FROM rota.job")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            role.execute("DELETE FROM rota.job")


def test_the_enqueue_role_is_told_which_enqueue_it_may_use(
    roles: Roles, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Rota's Python enqueue writes rota.job itself, which the enqueue role may
    # not: the error says so and names the SQL function the role may call.
    url = roles.urls["enqueue"]
    told = r"--grant-enqueue.*SQL function rota\.enqueue"
    for enqueue in (
        lambda: rota.enqueue(url, "t", {}),
        lambda: rota.enqueue_many(url, [rota.NewJob("t", {})]),
        lambda: asyncio.run(rota.enqueue_async(url, "t", {})),
    ):
        with pytest.raises(DatabaseError, match=told) as raised:
            enqueue()
        assert isinstance(raised.value.__cause__, psycopg.errors.InsufficientPrivilege)
    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    assert main(["enqueue", "t"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(told, err), err
    with roles.connect("enqueue") as role:
        assert rota.emit(role, "an.event") == 0  # the SQL function rota.emit, as the role
