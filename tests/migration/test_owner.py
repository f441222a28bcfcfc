"""Migrations run as the schema's owner, whoever connects.

A schema whose objects have two owners breaks twice: the default privileges
that `rota migrate --grant` set are the owner's, so the runtime roles get
nothing on objects another role creates, and the owner can no longer replace
the other role's functions. `rota migrate` by a role that can become the owner
(a superuser, a member of the owner role) migrates as the owner; any other role
is refused before anything is applied. The owner itself needs no right on the
database when an administrator made the schema for it.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from rota import sql
from rota.cli import main
from rota.migrate import applied, migrate

_counter = itertools.count()
SPLIT = 25
"""The first migration of 0.4 (it adds tables and functions): a schema of 0.3
ends just before it."""


class Roles:
    """LOGIN roles of this test, made on its server and dropped after it."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.database = conninfo_to_dict(db_url)["dbname"]
        self.names: list[str] = []

    def make(self, kind: str) -> tuple[str, str]:
        """A new role's name and the URL to connect as it."""
        name = f"rota_{kind}_{os.getpid()}_{next(_counter)}"
        password = secrets.token_hex(8)
        self.admin(
            pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                pgsql.Identifier(name), pgsql.Literal(password)
            )
        )
        self.names.append(name)
        return name, make_conninfo(self.db_url, user=name, password=password)

    def admin(self, statement: pgsql.Composable | str, *args: str) -> None:
        """Run `statement` as the server's superuser, role names composed in."""
        if isinstance(statement, str):
            ids = [pgsql.Identifier(a) for a in args]
            statement = pgsql.SQL(statement).format(*ids)  # type: ignore[arg-type]  # test text
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            conn.execute(statement)

    def drop(self) -> None:
        for name in reversed(self.names):
            self.admin("DROP OWNED BY {0} CASCADE; DROP ROLE {0}", name)


@pytest.fixture
def roles(empty_db_url: str) -> Iterator[Roles]:
    made = Roles(empty_db_url)
    try:
        yield made
    finally:
        made.drop()


def migrate_up_to(monkeypatch: pytest.MonkeyPatch, url: str, last: int, **grants: Any) -> None:
    """Migrate `url` as far as migration `last`, as an older Rota would have."""
    known = sql.migrations()
    with monkeypatch.context() as patch:
        patch.setattr(sql, "migrations", lambda: [m for m in known if m[0] <= last])
        migrate(url, **grants)


def owners(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pg_get_userbyid(relowner) FROM pg_class"
            " WHERE relnamespace = 'rota'::regnamespace"
            " UNION SELECT pg_get_userbyid(proowner) FROM pg_proc"
            " WHERE pronamespace = 'rota'::regnamespace"
            " UNION SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'rota'"
        ).fetchall()
    return {owner for (owner,) in rows}


def missing_rights(url: str, role: str) -> list[str]:
    """The tables and functions of schema rota that `role` cannot use as a runtime role."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname::text FROM pg_class WHERE relnamespace = 'rota'::regnamespace"
            " AND relkind = 'r' AND relname <> 'migrations'"
            " AND NOT has_table_privilege(%(role)s, oid, 'SELECT, INSERT, UPDATE, DELETE')"
            " UNION ALL SELECT oid::regprocedure::text FROM pg_proc"
            " WHERE pronamespace = 'rota'::regnamespace"
            " AND NOT has_function_privilege(%(role)s, oid, 'EXECUTE')",
            {"role": role},
        ).fetchall()
    return sorted(name for (name,) in rows)


@pytest.mark.parametrize("migrating", ["superuser", "member"])
def test_a_role_that_can_become_the_owner_migrates_as_the_owner(
    roles: Roles, empty_db_url: str, monkeypatch: pytest.MonkeyPatch, migrating: str
) -> None:
    owner, owner_url = roles.make("owner")
    app, _ = roles.make("app")
    roles.admin("GRANT CREATE ON DATABASE {} TO {}", roles.database, owner)
    migrate_up_to(monkeypatch, owner_url, SPLIT - 1, grant=[app])
    url = empty_db_url
    if migrating == "member":
        member, url = roles.make("member")
        roles.admin("GRANT {} TO {}", owner, member)

    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    assert main(["migrate"]) == 0

    assert applied(owner_url) == [n for n, _, _ in sql.migrations()]
    assert owners(owner_url) == {owner}
    assert missing_rights(owner_url, app) == []
    # The owner migrates on, and grants again, as before.
    assert migrate(owner_url, grant=[app]) == []


def test_a_role_that_cannot_become_the_owner_is_refused_and_nothing_is_applied(
    roles: Roles,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    owner, owner_url = roles.make("owner")
    other, other_url = roles.make("other")
    roles.admin("GRANT CREATE ON DATABASE {} TO {}", roles.database, owner)
    roles.admin("GRANT CREATE ON DATABASE {} TO {}", roles.database, other)
    roles.admin("GRANT ALL ON SCHEMA public TO {}", other)
    migrate_up_to(monkeypatch, owner_url, SPLIT - 1)
    roles.admin("GRANT CREATE, USAGE ON SCHEMA rota TO {}", other)  # rights, not ownership

    monkeypatch.setenv("ROTA_DATABASE_URL", other_url)
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rota: error: ") and err.count("\n") == 1, err
    assert owner in err and other in err, err

    assert applied(owner_url) == [n for n, _, _ in sql.migrations() if n < SPLIT]
    assert owners(owner_url) == {owner}


def test_the_schema_s_owner_migrates_without_rights_on_the_database(
    roles: Roles, empty_db_url: str
) -> None:
    # An administrator makes the schema for its owner, who may not create
    # schemas in the database; a run with nothing to apply needs no more.
    owner, owner_url = roles.make("owner")
    roles.admin("CREATE SCHEMA rota AUTHORIZATION {}", owner)
    assert migrate(owner_url) == [n for n, _, _ in sql.migrations()]
    assert migrate(owner_url) == []
    assert owners(owner_url) == {owner}
