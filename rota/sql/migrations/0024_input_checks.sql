-- The limits of docs/limits.md, kept by the database for every writer: the
-- Python API, rota.enqueue() in SQL, the console, a plain INSERT or UPDATE of
-- a migration script or a hand fix. Python checks the same numbers first to
-- refuse early (tests/integration/test_input_checks.py proves they agree);
-- this is the rule. A refusal is invalid_parameter_value (22023), the code
-- rota.enqueue() has always raised, with the same one-line reason as Python.
--
-- Row triggers, not CHECK constraints: a CHECK is evaluated again on every
-- update of the row (each claim, heartbeat and finish would walk the payload),
-- and a NOT VALID CHECK refuses any update of a row written before it, so one
-- old row would fail the claim of every job beside it. The triggers fire on
-- INSERT and on UPDATE of the checked columns only; the payload is walked only
-- when it is written. Rows already in the table are left as they are (the
-- readers show them as raw text; see docs/limits.md). A session that disables
-- triggers (session_replication_role = replica, superusers only) writes around
-- them, and the readers survive that too.

-- Python's str.isspace() characters: a name made only of them is blank. A name
-- that starts with a printable ASCII character (nearly all) is decided by its
-- first character alone; translate() over the set costs microseconds.
CREATE FUNCTION rota.blank(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN ascii(value) BETWEEN 33 AND 126 THEN false
        ELSE translate(value, E'\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \u0085\u00a0\u1680'
                              '\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008'
                              '\u2009\u200a\u2028\u2029\u202f\u205f\u3000', '') = ''
    END
$$;

-- A job type, key, group or schedule name: non-blank, at most 1,024 bytes.
-- NULL when the value is fine (a NULL value is the column's business).
CREATE FUNCTION rota.name_problem(value text, what text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN value IS NULL THEN NULL
        WHEN rota.blank(value) THEN format('%s must be a non-empty string, not %L', what, value)
        WHEN octet_length(value) > 1024
            THEN format('%s is %s bytes long, over the limit of 1024', what, octet_length(value))
    END
$$;

-- A payload (or a schedule's): at most 262,144 bytes as PostgreSQL prints it,
-- nested at most 100 arrays or objects deep (a container on level 100 of the
-- path language is on the 101st). Python's JSON reader recurses per level.
CREATE FUNCTION rota.payload_problem(value jsonb, what text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN value IS NULL THEN NULL
        WHEN jsonb_path_exists(value,
                 'strict $.**{100} ? (@.type() == "array" || @.type() == "object")')
            THEN format('%s is nested more than 100 levels deep', what)
        WHEN octet_length(value::text) > 262144
            THEN format('%s is %s bytes, over the limit of 262144 bytes',
                        what, octet_length(value::text))
    END
$$;

-- A time a job may run at: within what Python's datetime reads back in any
-- time zone (infinity and the year 20000 are refused).
CREATE FUNCTION rota.instant_problem(value timestamptz, what text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN value IS NULL THEN NULL
        WHEN value < '1970-01-01T00:00:00Z' OR value > '9999-12-30T00:00:00Z'
            THEN format('%s must be from 1970-01-01 to 9999-12-30 UTC, not %s', what, value)
    END
$$;

-- TG_ARGV[0]: 'all' on INSERT, 'fields' or 'payload' on an UPDATE of them.
CREATE FUNCTION rota.job_checked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF TG_ARGV[0] <> 'payload' THEN
        problem := coalesce(
            CASE WHEN NEW.type IS NULL THEN 'job type must be a non-empty string, not NULL' END,
            rota.name_problem(NEW.type, 'job type'),
            rota.name_problem(NEW.idempotency_key, 'an idempotency key'),
            rota.name_problem(NEW.unique_key, 'an idempotency key'),
            rota.name_problem(NEW.group_key, 'a group'),
            rota.instant_problem(NEW.run_at, 'run_at'),
            CASE WHEN NEW.priority IS NULL OR NEW.priority NOT BETWEEN 0 AND 9
                THEN format('priority must be a whole number from 0 (first) to 9, not %s',
                            coalesce(NEW.priority::text, 'NULL')) END,
            CASE WHEN NEW.max_attempts < 1
                THEN format('max_attempts must be a whole number of at least 1, not %s',
                            NEW.max_attempts) END,
            CASE WHEN NEW.timeout_seconds = 'NaN' OR NEW.timeout_seconds <= 0
                      OR NEW.timeout_seconds > 315360000
                THEN format('timeout must be more than 0 and at most 315360000 seconds, not %s',
                            NEW.timeout_seconds) END);
    END IF;
    IF problem IS NULL AND TG_ARGV[0] <> 'fields' THEN
        problem := rota.payload_problem(NEW.payload, 'payload');
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING MESSAGE = problem, ERRCODE = 'invalid_parameter_value',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER job_checked_insert BEFORE INSERT ON rota.job
    FOR EACH ROW EXECUTE FUNCTION rota.job_checked('all');
-- An UPDATE that names a checked column without changing it (an outcome's SET
-- lists run_at whatever the outcome) is passed over by the WHEN: checking a
-- value already stored would cost every finished job a trigger call.
CREATE TRIGGER job_checked_fields
    BEFORE UPDATE OF type, idempotency_key, unique_key, group_key, run_at, priority,
                     max_attempts, timeout_seconds ON rota.job
    FOR EACH ROW
    WHEN (OLD.type IS DISTINCT FROM NEW.type
          OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key
          OR OLD.unique_key IS DISTINCT FROM NEW.unique_key
          OR OLD.group_key IS DISTINCT FROM NEW.group_key
          OR OLD.run_at IS DISTINCT FROM NEW.run_at
          OR OLD.priority IS DISTINCT FROM NEW.priority
          OR OLD.max_attempts IS DISTINCT FROM NEW.max_attempts
          OR OLD.timeout_seconds IS DISTINCT FROM NEW.timeout_seconds)
    EXECUTE FUNCTION rota.job_checked('fields');
CREATE TRIGGER job_checked_payload BEFORE UPDATE OF payload ON rota.job
    FOR EACH ROW WHEN (OLD.payload IS DISTINCT FROM NEW.payload)
    EXECUTE FUNCTION rota.job_checked('payload');

-- The tables of names a user writes: schedules, limits, paused types.
CREATE FUNCTION rota.names_checked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF TG_TABLE_NAME = 'schedule' THEN
        problem := coalesce(rota.name_problem(NEW.name, 'schedule name'),
                            rota.name_problem(NEW.job_type, 'job type'),
                            rota.payload_problem(NEW.payload, 'payload'));
    ELSE
        problem := rota.name_problem(NEW.type, 'job type');
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING MESSAGE = problem, ERRCODE = 'invalid_parameter_value',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER schedule_checked BEFORE INSERT OR UPDATE OF name, job_type, payload
    ON rota.schedule FOR EACH ROW EXECUTE FUNCTION rota.names_checked();
CREATE TRIGGER job_limit_checked BEFORE INSERT OR UPDATE OF type
    ON rota.job_limit FOR EACH ROW EXECUTE FUNCTION rota.names_checked();
CREATE TRIGGER paused_type_checked BEFORE INSERT OR UPDATE OF type
    ON rota.paused_type FOR EACH ROW EXECUTE FUNCTION rota.names_checked();

-- rota.enqueue() runs as its owner with a fixed search_path, so a role given
-- EXECUTE on it alone (`rota migrate --grant-enqueue`) can enqueue without any
-- right on the table, and cannot make it resolve a name to an object of its
-- own. Its checks are the trigger's now: one rule, one message.
CREATE OR REPLACE FUNCTION rota.enqueue(
    job_type text,
    payload jsonb DEFAULT '{}',
    key text DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT 0,
    max_attempts int DEFAULT NULL,
    group_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    new_id bigint;
BEGIN
    IF enqueue.priority IS NOT NULL AND enqueue.priority NOT BETWEEN 0 AND 9 THEN
        -- An int beyond smallint would fail its cast before the trigger saw it.
        RAISE EXCEPTION 'priority must be a whole number from 0 (first) to 9, not %',
            enqueue.priority USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO rota.job AS j (type, payload, idempotency_key, run_at, priority, max_attempts,
                               group_key)
    VALUES (enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb), enqueue.key,
            coalesce(enqueue.run_at, now()), enqueue.priority,
            coalesce(enqueue.max_attempts, 20), enqueue.group_key)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        -- The key is held: by a committed row, or by one whose transaction
        -- committed while this insert waited for it (a new statement sees it).
        SELECT j.id INTO new_id FROM rota.job AS j WHERE j.idempotency_key = enqueue.key;
    END IF;
    RETURN new_id;
END
$$;

-- Functions are executable by PUBLIC unless revoked: Rota's are for the roles
-- `rota migrate --grant-*` names, each given exactly its own. `rota migrate`
-- revokes again after every run, covering functions of later migrations.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA rota FROM PUBLIC;
