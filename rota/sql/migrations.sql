-- Bookkeeping of `rota migrate` (rota/migrate.py). Migrations themselves are
-- the numbered files in migrations/.

-- name: migrate_lock
-- One migrating process at a time; the others wait here, then find nothing to do.
SELECT pg_advisory_xact_lock(%(lock_id)s)

-- name: migrate_bootstrap
CREATE SCHEMA IF NOT EXISTS rota;
CREATE TABLE IF NOT EXISTS rota.migrations (
    id         integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migration_applied
SELECT EXISTS (SELECT 1 FROM rota.migrations WHERE id = %(id)s) AS applied

-- name: migration_record
INSERT INTO rota.migrations (id, name) VALUES (%(id)s, %(name)s)

-- name: migrations_table_exists
SELECT to_regclass('rota.migrations') IS NOT NULL AS found

-- name: migrations_applied
SELECT id FROM rota.migrations ORDER BY id
