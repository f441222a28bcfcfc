"""Forward-only, numbered migrations recorded in ``rota.migrations``.

Any number of processes may run `migrate()` at once: a transaction-scoped
advisory lock lets one apply what is missing while the others wait, then find
nothing left to do. Each migration is recorded in the same transaction that
applies it, so a crash leaves either all of it or none of it.

Migrations run as the schema's owner. The processes that only use the schema
(workers, schedulers, reapers, the operator, the console) can run as a role of
their own that `migrate(..., grant=[role])` gives exactly the rights they need
(rota/sql/privileges.sql): no CREATE on the schema, no ownership, so that role
cannot change the schema.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from psycopg import sql as pgsql

from rota import sql
from rota.db import ConnOrDsn, connection, errors_wrapped, fetch_all
from rota.errors import InvalidInput, MigrationError

log = logging.getLogger(__name__)

# Any fixed number will do; it only has to be the same in every process.
_LOCK_ID = 0x726F7461  # "rota"


def migrate(conn_or_dsn: ConnOrDsn, grant: Sequence[str] = ()) -> list[int]:
    """Apply every migration not yet applied; return the numbers applied now.

    Then give each role in `grant` the runtime rights on every object of the
    schema (again each time, so objects of new migrations are covered). A role
    that does not exist is `InvalidInput`, raised before anything is changed.
    """
    applied_now: list[int] = []
    with connection(conn_or_dsn) as conn, errors_wrapped():
        for role in grant:
            if (
                not role
                or not fetch_all(conn, sql.query("role_exists"), {"role": role})[0]["found"]
            ):
                raise InvalidInput(f"--grant: no database role named {role!r} (create it first)")
        for number, name, text in sql.migrations():
            with conn.transaction():
                fetch_all(conn, sql.query("migrate_lock"), {"lock_id": _LOCK_ID})
                conn.execute(sql.query("migrate_bootstrap"))
                if fetch_all(conn, sql.query("migration_applied"), {"id": number})[0]["applied"]:
                    continue
                log.info("applying migration %04d_%s", number, name)
                conn.execute(text.encode())
                fetch_all(conn, sql.query("migration_record"), {"id": number, "name": name})
                applied_now.append(number)
        if grant:
            with conn.transaction():
                fetch_all(conn, sql.query("migrate_lock"), {"lock_id": _LOCK_ID})
                for role in dict.fromkeys(grant):
                    statement = pgsql.SQL(sql.query("grant_runtime"))
                    conn.execute(statement.format(role=pgsql.Identifier(role)))
                    log.info("granted the runtime rights on schema rota to %s", role)
    return applied_now


def applied(conn_or_dsn: ConnOrDsn) -> list[int]:
    """The numbers of the migrations applied to this database."""
    with connection(conn_or_dsn) as conn:
        if not fetch_all(conn, sql.query("migrations_table_exists"))[0]["found"]:
            return []
        rows = fetch_all(conn, sql.query("migrations_applied"))
    return [row["id"] for row in rows]


def require_current(conn_or_dsn: ConnOrDsn) -> None:
    """Raise `MigrationError` unless every migration this code knows is applied."""
    known = [number for number, _, _ in sql.migrations()]
    missing = sorted(set(known) - set(applied(conn_or_dsn)))
    if missing:
        raise MigrationError(
            f"database schema is not up to date (run `rota migrate`): missing {missing}"
        )
