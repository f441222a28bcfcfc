-- Least privilege (`rota migrate --grant-worker/--grant-enqueue/--grant-read
-- ROLE`, rota/migrate.py). Each kind is the whole of a role's rights in schema
-- rota: a grant first takes back everything the role had there, so a role
-- moved from one kind to another keeps nothing of the old one. Never CREATE on
-- the schema, never ownership, never TRUNCATE: no role can change the schema.
-- {role} is a quoted identifier composed in by psycopg.sql, never user text.
-- docs/operations.md lists what each kind can do;
-- tests/roles/test_role_matrix.py tries every table and function as each.

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(role)s) AS found

-- name: revoke_public_execute
-- Functions are executable by PUBLIC unless revoked; Rota's are for the roles
-- it grants them to. Run by every `rota migrate`, though it applied nothing, so
-- new functions are covered even after a run that died before its grants.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC

-- name: grant_reset
REVOKE ALL ON ALL TABLES IN SCHEMA rota FROM {role};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA rota FROM {role};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA rota FROM {role};
REVOKE ALL ON SCHEMA rota FROM {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota REVOKE ALL ON TABLES FROM {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota REVOKE ALL ON SEQUENCES FROM {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota REVOKE ALL ON FUNCTIONS FROM {role}

-- name: grant_worker
-- Workers, schedulers, reapers, the archiver and the operator: every table but
-- the console's (audit, web_session), every sequence and function.
GRANT USAGE ON SCHEMA rota TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA rota TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA rota TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA rota TO {role};
-- Migrations are recorded by the schema owner only; the runtime checks them.
REVOKE INSERT, UPDATE, DELETE ON rota.migrations FROM {role};
REVOKE ALL ON rota.audit, rota.web_session FROM {role};
-- Objects the migrating role creates later in rota get the same rights at once
-- (re-running `rota migrate --grant-worker` also grants them).
ALTER DEFAULT PRIVILEGES IN SCHEMA rota
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota GRANT USAGE, SELECT ON SEQUENCES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota GRANT EXECUTE ON FUNCTIONS TO {role}

-- name: grant_console
-- `--grant ROLE` (0.3's runtime grant, kept): the worker's rights and the
-- console's tables. The audit trail is appended to and read, never changed.
GRANT SELECT, INSERT ON rota.audit TO {role};
GRANT SELECT, INSERT, DELETE ON rota.web_session TO {role}

-- name: grant_read
-- Dashboards and the read-only console: SELECT on every table but the
-- console's sessions; no function, no sequence, no write.
GRANT USAGE ON SCHEMA rota TO {role};
GRANT SELECT ON ALL TABLES IN SCHEMA rota TO {role};
REVOKE ALL ON rota.web_session FROM {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota GRANT SELECT ON TABLES TO {role}

-- name: grant_enqueue_schema
GRANT USAGE ON SCHEMA rota TO {role}

-- name: enqueue_functions
-- The functions an enqueue-only role may call: rota.enqueue, and rota.emit
-- where a migration defines it. Both run as their owner (SECURITY DEFINER).
SELECT p.proname AS name
FROM pg_proc AS p
WHERE p.pronamespace = 'rota'::regnamespace AND p.proname IN ('enqueue', 'emit')
ORDER BY p.proname

-- name: grant_enqueue_function
GRANT EXECUTE ON FUNCTION rota.{function} TO {role}
