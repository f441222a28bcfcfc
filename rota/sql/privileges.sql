-- Least privilege (`rota migrate --grant ROLE`, rota/migrate.py): the rights the
-- workers, schedulers, reapers, the operator and the console need, over every
-- object in schema rota, whatever later migrations add. Never CREATE on the
-- schema, never ownership, never TRUNCATE: the role cannot change the schema.
-- {role} is a quoted identifier composed in by psycopg.sql, never user text.

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(role)s) AS found

-- name: grant_runtime
GRANT USAGE ON SCHEMA rota TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA rota TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA rota TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA rota TO {role};
-- Migrations are recorded by the schema owner only; the runtime checks them.
REVOKE INSERT, UPDATE, DELETE ON rota.migrations FROM {role};
-- Objects the migrating role creates later in rota get the same rights at once
-- (re-running `rota migrate --grant` also grants them).
ALTER DEFAULT PRIVILEGES IN SCHEMA rota
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota GRANT USAGE, SELECT ON SEQUENCES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA rota GRANT EXECUTE ON FUNCTIONS TO {role}
