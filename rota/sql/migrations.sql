-- Bookkeeping of `rota migrate` (rota/migrate.py). Migrations themselves are
-- the numbered files in migrations/.

-- name: migrate_lock
-- One migrating process at a time; the others wait here, then find nothing to do.
SELECT pg_advisory_xact_lock(%(lock_id)s)

-- name: migration_owner
-- Who owns schema rota (NULL before the first migration), and who connected.
SELECT (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'rota') AS owner,
       current_user AS role

-- name: migrate_as_owner
-- The rest of the transaction runs as the schema's owner, so that every object
-- is the owner's and its default privileges (the grants) cover them. {owner}
-- is a quoted identifier composed in by psycopg.sql.
SET LOCAL ROLE {owner}

-- name: migrate_bootstrap
-- The schema is looked for first: CREATE SCHEMA IF NOT EXISTS checks the
-- right to create schemas in the database before it looks, and the schema's
-- owner may not have it when an administrator made the schema for it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'rota') THEN
        CREATE SCHEMA rota;
    END IF;
END
$$;
CREATE TABLE IF NOT EXISTS rota.migrations (
    id         integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migration_applied
SELECT EXISTS (SELECT 1 FROM rota.migrations WHERE id = %(id)s) AS applied

-- name: migration_lock_timeout
-- A migration (or the key index's switch) that waits for a table's lock (a
-- long transaction read the table) would stop every claim and enqueue queued
-- behind it: it gives up after a moment, and tries again. For the rest of the
-- transaction.
SELECT set_config('lock_timeout', %(timeout)s, true)

-- name: migration_lock_holders
-- The tables of schema rota on which other sessions have held a lock for
-- longer than a migration waited: what it waited for, and who holds it (a
-- session whose start this role may not see counts).
SELECT l.relation::regclass::text AS "table", array_agg(DISTINCT l.pid ORDER BY l.pid) AS pids
FROM pg_locks AS l
JOIN pg_class AS c ON c.oid = l.relation
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE c.relnamespace = 'rota'::regnamespace AND c.relkind IN ('r', 'p')
  AND l.granted AND l.pid <> pg_backend_pid()
  AND (a.xact_start IS NULL OR a.xact_start < now() - make_interval(secs => %(waited)s))
GROUP BY l.relation
ORDER BY 1

-- name: migration_record
INSERT INTO rota.migrations (id, name) VALUES (%(id)s, %(name)s)

-- name: migrations_table_exists
SELECT to_regclass('rota.migrations') IS NOT NULL AS found

-- name: migrations_applied
SELECT id FROM rota.migrations ORDER BY id

-- How idempotency keys are kept unique (rota.migrate.use_key_index): by the
-- unique constraint job_idempotency_key_key, an index entry for every row
-- version, or by the partial unique index job_idempotency_key_idx over the
-- keyed rows only. job_idempotency_key_new is the constraint's index while it
-- is being built.

-- name: key_index_state
SELECT EXISTS (SELECT FROM pg_constraint
               WHERE conrelid = 'rota.job'::regclass
                 AND conname = 'job_idempotency_key_key') AS has_constraint,
       (SELECT indisvalid FROM pg_index
        WHERE indexrelid = to_regclass('rota.job_idempotency_key_idx')) AS partial_valid,
       (SELECT indisvalid FROM pg_index
        WHERE indexrelid = to_regclass('rota.job_idempotency_key_new')) AS new_valid

-- name: key_index_lock
-- One switch at a time, held for the whole switch (a session lock: the indexes
-- are built outside a transaction). Tried, never waited for: a statement
-- waiting for it would hold a snapshot, which the other switch's CREATE INDEX
-- CONCURRENTLY waits for in turn, a deadlock.
SELECT pg_try_advisory_lock(%(lock_id)s) AS locked

-- name: key_index_unlock
SELECT pg_advisory_unlock(%(lock_id)s)

-- name: key_partial_drop
DROP INDEX CONCURRENTLY IF EXISTS rota.job_idempotency_key_idx

-- name: key_partial_create
CREATE UNIQUE INDEX CONCURRENTLY job_idempotency_key_idx ON rota.job (idempotency_key)
    WHERE idempotency_key IS NOT NULL

-- name: key_constraint_drop
ALTER TABLE rota.job DROP CONSTRAINT job_idempotency_key_key

-- name: key_new_drop
DROP INDEX CONCURRENTLY IF EXISTS rota.job_idempotency_key_new

-- name: key_new_create
CREATE UNIQUE INDEX CONCURRENTLY job_idempotency_key_new ON rota.job (idempotency_key)

-- name: key_constraint_add
ALTER TABLE rota.job ADD CONSTRAINT job_idempotency_key_key
    UNIQUE USING INDEX job_idempotency_key_new
