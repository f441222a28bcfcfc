-- The input checks of migration 0024, asked first in each trigger's WHEN
-- clause. A WHEN clause is planned as an expression: the SQL functions below
-- are inlined into it and evaluated by the executor, with no function call.
-- Only a row that breaks a rule calls rota.job_checked(), which finds the
-- rule and raises its message (22023), as before. A valid row (nearly every
-- row) no longer pays a PL/pgSQL call and four SQL function calls: an insert
-- into rota.job took 21 us of the server's time with the call and 7 us
-- without it (docs/limits.md, "Kept by the database").
--
-- Each *_fits function is true or NULL for a value within the rules (NULL
-- where the value is NULL: the column's own business) and false for a value
-- past one. rota.job_fits() ANDs them: false as soon as one rule is broken,
-- so a trigger whose WHEN is NOT rota.job_fits(...) fires exactly for the rows
-- rota.job_checked() refuses (tests/promises/test_input_checks.py proves the
-- two agree on values at every edge).

CREATE FUNCTION rota.name_fits(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT rota.blank(value) AND octet_length(value) <= 1024
$$;

CREATE FUNCTION rota.payload_fits(value jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT jsonb_path_exists(value,
                   'strict $.**{100} ? (@.type() == "array" || @.type() == "object")')
       AND octet_length(value::text) <= 262144
$$;

CREATE FUNCTION rota.instant_fits(value timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT value BETWEEN '1970-01-01T00:00:00Z' AND '9999-12-30T00:00:00Z'
$$;

CREATE FUNCTION rota.job_fits(
    type text, idempotency_key text, unique_key text, group_key text, run_at timestamptz,
    priority smallint, max_attempts integer, timeout_seconds double precision, payload jsonb
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT type IS NOT NULL AND rota.name_fits(type)
       AND rota.name_fits(idempotency_key)
       AND rota.name_fits(unique_key)
       AND rota.name_fits(group_key)
       AND rota.instant_fits(run_at)
       AND priority IS NOT NULL AND priority BETWEEN 0 AND 9
       AND max_attempts >= 1
       AND timeout_seconds <> 'NaN' AND timeout_seconds > 0 AND timeout_seconds <= 315360000
       AND rota.payload_fits(payload)
$$;

DROP TRIGGER job_checked_insert ON rota.job;
CREATE TRIGGER job_checked_insert BEFORE INSERT ON rota.job
    FOR EACH ROW
    WHEN (NOT rota.job_fits(NEW.type, NEW.idempotency_key, NEW.unique_key, NEW.group_key,
                            NEW.run_at, NEW.priority, NEW.max_attempts, NEW.timeout_seconds,
                            NEW.payload))
    EXECUTE FUNCTION rota.job_checked('all');

-- An update that changes a checked column to a value within the rules (a
-- retry's run_at) calls no function either; one that leaves them as they were
-- is passed over as before, so an old row that breaks a rule does not fail it.
-- The payload is not looked at here (NULL fits): its own trigger checks it
-- when it changes.
DROP TRIGGER job_checked_fields ON rota.job;
CREATE TRIGGER job_checked_fields
    BEFORE UPDATE OF type, idempotency_key, unique_key, group_key, run_at, priority,
                     max_attempts, timeout_seconds ON rota.job
    FOR EACH ROW
    WHEN ((OLD.type, OLD.idempotency_key, OLD.unique_key, OLD.group_key, OLD.run_at,
           OLD.priority, OLD.max_attempts, OLD.timeout_seconds)
          IS DISTINCT FROM (NEW.type, NEW.idempotency_key, NEW.unique_key, NEW.group_key,
                            NEW.run_at, NEW.priority, NEW.max_attempts, NEW.timeout_seconds)
          AND NOT rota.job_fits(NEW.type, NEW.idempotency_key, NEW.unique_key, NEW.group_key,
                                NEW.run_at, NEW.priority, NEW.max_attempts,
                                NEW.timeout_seconds, NULL))
    EXECUTE FUNCTION rota.job_checked('fields');

DROP TRIGGER job_checked_payload ON rota.job;
CREATE TRIGGER job_checked_payload BEFORE UPDATE OF payload ON rota.job
    FOR EACH ROW
    WHEN (OLD.payload IS DISTINCT FROM NEW.payload AND NOT rota.payload_fits(NEW.payload))
    EXECUTE FUNCTION rota.job_checked('payload');

REVOKE EXECUTE ON FUNCTION rota.name_fits(text), rota.payload_fits(jsonb),
    rota.instant_fits(timestamptz),
    rota.job_fits(text, text, text, text, timestamptz, smallint, integer, double precision, jsonb)
    FROM PUBLIC;
