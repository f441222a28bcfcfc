"""Forward-only, numbered migrations recorded in ``rota.migrations``.

Any number of processes may run `migrate()` at once: a transaction-scoped
advisory lock lets one apply what is missing while the others wait, then find
nothing left to do. Each migration is recorded in the same transaction that
applies it, so a crash leaves either all of it or none of it.

Migrations run as the schema's owner: a role that can become the owner (a
superuser, a member of the owner role) migrates as the owner, so the schema's
objects never have two owners; any other role is refused before anything is
applied. The processes that only use the schema (workers, schedulers,
reapers, the operator, the console, an application that only enqueues, a
dashboard) can run as roles of their own that `migrate()` gives exactly the
rights they need (rota/grants.py): no CREATE on the schema, no ownership, so
none of them can change the schema.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import psycopg
from psycopg import sql as pgsql

from rota import grants, sql
from rota.db import Conn, ConnOrDsn, connection, errors_wrapped, fetch_all
from rota.errors import DatabaseError, InvalidInput, MigrationError

log = logging.getLogger(__name__)

# Any fixed number will do; it only has to be the same in every process.
_LOCK_ID = 0x726F7461  # "rota"


def migrate(
    conn_or_dsn: ConnOrDsn,
    grant: Sequence[str] = (),
    *,
    grant_worker: Sequence[str] = (),
    grant_enqueue: Sequence[str] = (),
    grant_read: Sequence[str] = (),
) -> list[int]:
    """Apply every migration not yet applied; return the numbers applied now.

    Then, on every run, take EXECUTE on the schema's functions from PUBLIC and
    give each named role exactly the rights of its kind on every object of the
    schema (rota/grants.py; again each time, so objects of new migrations are
    covered): `grant_worker` the workers' and the operator's, `grant` those
    and the console's tables (the runtime grant of 0.3), `grant_enqueue`
    EXECUTE on rota.enqueue (and rota.emit) only, `grant_read` SELECT. A role
    that does not exist, or a predefined role of PostgreSQL (pg_*, which would
    hand Rota's tables to everybody it is granted to), is `InvalidInput`,
    raised before anything is changed; so is a role that neither owns schema
    rota nor can become its owner (SET ROLE), when the schema exists.
    """
    roles = grants.checked(
        {"runtime": grant, "worker": grant_worker, "enqueue": grant_enqueue, "read": grant_read}
    )
    applied_now: list[int] = []
    said: set[str] = set()
    with connection(conn_or_dsn) as conn, errors_wrapped():
        grants.require_roles(conn, roles)
        for number, name, text in sql.migrations():
            if _apply(conn, number, name, text, said):
                applied_now.append(number)
        # Every run, though it applied nothing: a run that died before this
        # point left the functions of its migrations executable by PUBLIC.
        with conn.transaction():
            _lock_as_owner(conn, said)
            grants.apply(conn, roles)
        for kind, names in roles.items():
            for role in names:
                log.info("granted the %s rights on schema rota to %s", kind, role)
    return applied_now


_MIGRATION_LOCK_TIMEOUT_SECONDS = 2.0
"""How long a migration waits for a table's lock in one try: every claim and
enqueue that asks for the table meanwhile waits behind it."""

_MIGRATION_LOCK_TRIES = 20
"""Tries of one migration before `migrate()` gives up (about a minute)."""

_MIGRATION_LOCK_PAUSE_SECONDS = 1.0
"""Between tries: the claims and enqueues that queued behind go first."""


def _lock_waits_brief(conn: Conn) -> None:
    """For the rest of the transaction, a wait for a lock ends after
    `_MIGRATION_LOCK_TIMEOUT_SECONDS` (LockNotAvailable): a migration's, and
    the key index's switch."""
    timeout = f"{_MIGRATION_LOCK_TIMEOUT_SECONDS * 1000:.0f}ms"
    fetch_all(conn, sql.query("migration_lock_timeout"), {"timeout": timeout})


def _apply(conn: Conn, number: int, name: str, text: str, said: set[str]) -> bool:
    """Apply one migration unless it is applied, in one transaction; return
    whether it was applied now. A lock it cannot take soon is given up, and the
    whole migration tried again; `MigrationError` when it never could."""
    label = f"{number:04d}_{name}"
    waited_for = "a table of schema rota"
    for _ in range(_MIGRATION_LOCK_TRIES):
        try:
            with conn.transaction():
                _lock_as_owner(conn, said)
                conn.execute(sql.query("migrate_bootstrap"))
                if fetch_all(conn, sql.query("migration_applied"), {"id": number})[0]["applied"]:
                    return False
                _lock_waits_brief(conn)
                log.info("applying migration %s", label)
                conn.execute(text.encode())
                fetch_all(conn, sql.query("migration_record"), {"id": number, "name": name})
                return True
        except psycopg.errors.LockNotAvailable:
            waited_for = _lock_holders(conn)
            log.warning(
                "migration %s waited %g s for a lock on %s, held by a longer transaction;"
                " nothing of it is applied: trying again",
                label,
                _MIGRATION_LOCK_TIMEOUT_SECONDS,
                waited_for,
            )
            time.sleep(_MIGRATION_LOCK_PAUSE_SECONDS)
    raise MigrationError(
        f"migration {label} could not lock {waited_for} in {_MIGRATION_LOCK_TRIES} tries of"
        f" {_MIGRATION_LOCK_TIMEOUT_SECONDS:g} s: nothing of it is applied (the migrations"
        " before it are); end that transaction, or run `rota migrate` again later"
    )


def _lock_holders(conn: Conn) -> str:
    """The tables of schema rota that longer transactions hold, and their
    sessions, in words (after a migration gave up waiting)."""
    with conn.transaction():
        rows = fetch_all(
            conn, sql.query("migration_lock_holders"), {"waited": _MIGRATION_LOCK_TIMEOUT_SECONDS}
        )
    if not rows:
        return "a table of schema rota"
    return ", ".join(
        f"{row['table']} (pid {', '.join(str(pid) for pid in row['pids'])})" for row in rows
    )


def _lock_as_owner(conn: Conn, said: set[str]) -> None:
    """Take the migrations' lock, then run the rest of the transaction as the
    owner of schema rota (when it exists): objects another role created would
    escape the owner's default privileges, and the owner could not replace
    them. A role that cannot become the owner is `InvalidInput`."""
    fetch_all(conn, sql.query("migrate_lock"), {"lock_id": _LOCK_ID})
    found = fetch_all(conn, sql.query("migration_owner"))[0]
    owner, role = found["owner"], found["role"]
    if owner is None or owner == role:
        return
    statement = pgsql.SQL(sql.query("migrate_as_owner")).format(owner=pgsql.Identifier(owner))
    try:
        with conn.transaction():  # a savepoint, released: SET LOCAL holds to the end
            conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise InvalidInput(
            f"schema rota is owned by {owner!r}, and {role!r} can neither migrate it nor become"
            f" {owner!r} (SET ROLE): run `rota migrate` as {owner!r} or as a member of it"
        ) from exc
    if owner not in said:
        log.info("migrating as %s, the owner of schema rota (connected as %s)", owner, role)
        said.add(owner)


def applied(conn_or_dsn: ConnOrDsn) -> list[int]:
    """The numbers of the migrations applied to this database."""
    with connection(conn_or_dsn) as conn:
        if not fetch_all(conn, sql.query("migrations_table_exists"))[0]["found"]:
            return []
        rows = fetch_all(conn, sql.query("migrations_applied"))
    return [row["id"] for row in rows]


def unknown(conn_or_dsn: ConnOrDsn) -> list[int]:
    """The migrations applied to this database that this code does not know: a
    newer Rota's."""
    known = {number for number, _, _ in sql.migrations()}
    return [number for number in applied(conn_or_dsn) if number not in known]


NEWER = (
    "the database has migrations this Rota does not know ({}): a newer Rota applied them;"
    " this one runs on such a schema (as old workers do while an upgrade rolls out),"
    " but no migration is undone: after a rollback, upgrade again"
)


def require_current(conn_or_dsn: ConnOrDsn) -> None:
    """Raise `MigrationError` unless every migration this code knows is applied;
    log a warning for those a newer Rota applied."""
    known = [number for number, _, _ in sql.migrations()]
    done = applied(conn_or_dsn)
    missing = sorted(set(known) - set(done))
    if missing:
        raise MigrationError(
            f"database schema is not up to date (run `rota migrate`): missing {missing}"
        )
    newer = sorted(set(done) - set(known))
    if newer:
        log.warning(NEWER.format(newer))


_DESCRIBED = {
    "constraint": "unique constraint job_idempotency_key_key",
    "partial": "partial unique index job_idempotency_key_idx",
}

KEY_INDEXES = tuple(_DESCRIBED)
"""How idempotency keys are kept unique (`rota migrate --key-index`).

constraint: the schema's unique constraint, job_idempotency_key_key (the
    default). Every row version has an entry in it, keyless ones included, and
    any statement may write `ON CONFLICT (idempotency_key)`.
partial: a unique index over the keyed rows only, job_idempotency_key_idx. A
    job without a key costs no entry in it, which takes an index entry off its
    claim and another off its outcome. A statement that inserts jobs must name
    the keyed rows: `ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT
    NULL`, as Rota's own do since 0.2 (those of 0.1, and hand-written ones
    without the WHERE, fail: PostgreSQL finds no arbiter for them).
"""

_LOCK_TRIES = 10
"""Tries at the instant's lock that adding or dropping the constraint takes."""

_KEY_LOCK_ID = _LOCK_ID + 1
"""One key index switch at a time (migrations take _LOCK_ID)."""

_KEY_LOCK_POLL_SECONDS = 0.2


def key_index(conn_or_dsn: ConnOrDsn) -> str:
    """How idempotency keys are kept unique now: one of KEY_INDEXES."""
    with connection(conn_or_dsn) as conn:
        state = fetch_all(conn, sql.query("key_index_state"))[0]
    if state["has_constraint"]:
        return "constraint"
    if state["partial_valid"]:
        return "partial"
    raise MigrationError(
        "rota.job has no unique index on idempotency_key: run `rota migrate --key-index constraint`"
    )


def use_key_index(conn_or_dsn: ConnOrDsn, kind: str) -> bool:
    """Keep idempotency keys unique the way `kind` says (see KEY_INDEXES).

    Returns whether anything changed. The new index is built first, without
    stopping writes (CREATE INDEX CONCURRENTLY), and the old one dropped after,
    so keys stay unique throughout; taking the constraint away or giving it
    back locks the table for an instant. A switch interrupted half way is
    finished by running it again. The connection must be in autocommit mode
    and outside a transaction; a second switch waits for the first.
    """
    if kind not in KEY_INDEXES:
        raise InvalidInput(f"key index must be one of {', '.join(KEY_INDEXES)}, not {kind!r}")
    with connection(conn_or_dsn) as conn:
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if not (conn.autocommit and idle):
            raise InvalidInput(
                "switching the key index needs an autocommit connection outside a transaction"
            )
        require_current(conn)
        _wait_for_key_lock(conn)
        try:
            state = fetch_all(conn, sql.query("key_index_state"))[0]
            changed = _to_partial(conn, state) if kind == "partial" else _to_constraint(conn, state)
        finally:
            fetch_all(conn, sql.query("key_index_unlock"), {"lock_id": _KEY_LOCK_ID})
    if changed:
        log.info("idempotency keys are now kept unique by the %s", _DESCRIBED[kind])
    return changed


def describe_key_index(kind: str) -> str:
    """`kind` of KEY_INDEXES in words, with the name of its index."""
    return _DESCRIBED[kind]


def _wait_for_key_lock(conn: Conn) -> None:
    """Take the switch's lock, trying again while another switch holds it."""
    said = False
    while not fetch_all(conn, sql.query("key_index_lock"), {"lock_id": _KEY_LOCK_ID})[0]["locked"]:
        if not said:
            log.info("waiting for another switch of the key index to end")
            said = True
        time.sleep(_KEY_LOCK_POLL_SECONDS)


def _to_partial(conn: Conn, state: dict[str, object]) -> bool:
    if state["partial_valid"] and not state["has_constraint"] and state["new_valid"] is None:
        return False
    if not state["partial_valid"]:
        conn.execute(sql.query("key_partial_drop"))  # an interrupted build leaves it invalid
        conn.execute(sql.query("key_partial_create"))
    if state["has_constraint"]:
        _briefly_locked(conn, "key_constraint_drop")
    conn.execute(sql.query("key_new_drop"))
    return True


def _to_constraint(conn: Conn, state: dict[str, object]) -> bool:
    if state["has_constraint"] and state["partial_valid"] is None:
        return False
    if not state["has_constraint"]:
        if not state["new_valid"]:
            conn.execute(sql.query("key_new_drop"))  # an interrupted build leaves it invalid
            conn.execute(sql.query("key_new_create"))
        _briefly_locked(conn, "key_constraint_add")
    conn.execute(sql.query("key_partial_drop"))
    return True


def _briefly_locked(conn: Conn, name: str) -> None:
    """Run a statement that locks rota.job, giving up on the lock after a moment
    (every claim and enqueue would queue up behind it) and trying again."""
    for _ in range(_LOCK_TRIES):
        try:
            with conn.transaction():
                _lock_waits_brief(conn)
                conn.execute(sql.query(name))
            return
        except psycopg.errors.LockNotAvailable:
            time.sleep(_MIGRATION_LOCK_PAUSE_SECONDS)
    raise DatabaseError(
        f"could not lock rota.job for an instant in {_LOCK_TRIES} tries (a long transaction"
        " holds it); the new index is in place: run the same command again"
    )
