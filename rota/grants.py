"""The rights of the roles that use schema rota without owning it.

Four kinds, each the whole of a role's rights in the schema (rota/sql/privileges.sql):

worker: workers, schedulers, reapers, the archiver and the operator. Every
    table but the console's (audit, web_session), every sequence and function.
runtime: `--grant ROLE`, the runtime grant of 0.3 kept for the scripts that
    use it: the worker's rights plus the console's tables (audit appended to,
    never changed; sessions).
enqueue: EXECUTE on rota.enqueue (and rota.emit where a migration defines it)
    only; both run as their owner, so the role needs no right on any table.
read: SELECT on every table but the console's sessions, for dashboards and
    the read-only console.

A grant first takes back what the role had in the schema, so granting another
kind moves a role rather than adding to it; a role named in several kinds gets
their union. This module never decides who may run `migrate`: the database does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from psycopg import sql as pgsql

from rota import limits, sql
from rota.db import Conn, fetch_all
from rota.errors import InvalidInput

KINDS = ("worker", "runtime", "enqueue", "read")
"""The kinds of grant, in the order they are applied to a role."""

FLAGS = {
    "worker": "--grant-worker",
    "runtime": "--grant",
    "enqueue": "--grant-enqueue",
    "read": "--grant-read",
}
"""The `rota migrate` flag of each kind."""

PREDEFINED_ROLE_PREFIX = "pg_"
"""PostgreSQL reserves role names starting so for its predefined roles
(pg_read_all_data, pg_monitor, ...): every grant refuses them."""


def checked(grants: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The roles of each kind, checked as names; `InvalidInput` for an unknown
    kind or a predefined role, before anything is changed."""
    roles: dict[str, list[str]] = {}
    for kind, names in grants.items():
        if kind not in KINDS:
            raise InvalidInput(f"unknown kind of grant {kind!r}: one of {', '.join(KINDS)}")
        flag = FLAGS[kind]
        roles[kind] = limits.names(names, f"{flag} roles")
        for role in roles[kind]:
            if role.startswith(PREDEFINED_ROLE_PREFIX):
                raise InvalidInput(
                    f"{flag}: {role!r} is a predefined role of PostgreSQL: grant to a role of"
                    " your own"
                )
    return roles


def require_roles(conn: Conn, roles: Mapping[str, Sequence[str]]) -> None:
    """`InvalidInput` when a named role does not exist."""
    for kind, names in roles.items():
        for role in names:
            if not fetch_all(conn, sql.query("role_exists"), {"role": role})[0]["found"]:
                raise InvalidInput(
                    f"{FLAGS[kind]}: no database role named {role!r} (create it first)"
                )


def apply(conn: Conn, roles: Mapping[str, Sequence[str]]) -> None:
    """Give each role exactly the rights of its kinds (in the caller's transaction)."""
    conn.execute(sql.query("revoke_public_execute"))
    kinds_of: dict[str, list[str]] = {}
    for kind in KINDS:
        for role in roles.get(kind, ()):
            kinds_of.setdefault(role, [])
            if kind not in kinds_of[role]:
                kinds_of[role].append(kind)
    for role, kinds in kinds_of.items():
        _run(conn, "grant_reset", role)
        for kind in kinds:
            _grant(conn, kind, role)


def _grant(conn: Conn, kind: str, role: str) -> None:
    if kind in ("worker", "runtime"):
        _run(conn, "grant_worker", role)
    if kind == "runtime":
        _run(conn, "grant_console", role)
    if kind == "read":
        _run(conn, "grant_read", role)
    if kind == "enqueue":
        _run(conn, "grant_enqueue_schema", role)
        for row in fetch_all(conn, sql.query("enqueue_functions")):
            statement = pgsql.SQL(sql.query("grant_enqueue_function")).format(
                function=pgsql.Identifier(row["name"]), role=pgsql.Identifier(role)
            )
            conn.execute(statement)


def _run(conn: Conn, name: str, role: str) -> None:
    conn.execute(pgsql.SQL(sql.query(name)).format(role=pgsql.Identifier(role)))
