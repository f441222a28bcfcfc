-- The rules a limit's window and an event keep at every door, and an attempt's
-- error kept whatever `errors` held before.
--
-- A rate's window (`per_seconds`) was checked only for being above 0. The
-- Python API refuses a window that is not a number or longer than ten years,
-- but a plain INSERT or UPDATE took Infinity, NaN or 1e300, and then every
-- claim, of every type, failed: the claim moves its instant back by the window
-- to count the recent starts ("interval out of range"). The rule is now the
-- Python API's, kept by a trigger with the same reason as every other refusal
-- (22023) and by a CHECK that holds even for a writer who turns triggers off,
-- so that no row of rota.job_limit can stop the claims. A window already past
-- the rule becomes the longest one there is, ten years: of the limits it could
-- mean, the one that lets the fewest jobs start.
--
-- rota.emit() in SQL, and a plain INSERT into rota.job_event, took any key and
-- any payload; Python's rota.emit refused a blank key, one over 1,024 bytes and
-- a payload past the payload's limits. The same trigger now keeps those rules
-- for the events.
--
-- `errors` is a column any writer may fill. An object, a number or a string
-- there made rota.errors_with() fail ("cannot get array length of a
-- non-array"), and with it the reaper's every batch (no expired lease was
-- given back any more) and a worker's outcome batch. The history it cannot
-- read is now left out: the new attempt's error starts a list of its own.

UPDATE rota.job_limit SET per_seconds = 315360000 WHERE per_seconds > 315360000;
ALTER TABLE rota.job_limit
    DROP CONSTRAINT job_limit_per_seconds_check,
    ADD CONSTRAINT job_limit_per_seconds_check
        CHECK (per_seconds > 0 AND per_seconds <= 315360000);

CREATE OR REPLACE FUNCTION rota.names_checked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF TG_TABLE_NAME = 'schedule' THEN
        problem := coalesce(rota.name_problem(NEW.name, 'schedule name'),
                            rota.name_problem(NEW.job_type, 'job type'),
                            rota.payload_problem(NEW.payload, 'payload'));
    ELSIF TG_TABLE_NAME = 'job_event' THEN
        problem := coalesce(CASE WHEN NEW.key IS NULL
                                 THEN 'event key must be a non-empty string, not NULL' END,
                            rota.name_problem(NEW.key, 'event key'),
                            rota.payload_problem(NEW.payload, 'payload'));
    ELSIF TG_TABLE_NAME = 'job_limit' THEN
        -- NaN is above every number here, as in the CHECK.
        problem := coalesce(
            rota.name_problem(NEW.type, 'job type'),
            CASE WHEN NEW.per_seconds <= 0 OR NEW.per_seconds > 315360000
                THEN format('per must be more than 0 and at most 315360000 seconds, not %s',
                            NEW.per_seconds) END);
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

DROP TRIGGER job_limit_checked ON rota.job_limit;
CREATE TRIGGER job_limit_checked BEFORE INSERT OR UPDATE OF type, per_seconds
    ON rota.job_limit FOR EACH ROW EXECUTE FUNCTION rota.names_checked();
CREATE TRIGGER job_event_checked BEFORE INSERT OR UPDATE OF key, payload
    ON rota.job_event FOR EACH ROW EXECUTE FUNCTION rota.names_checked();

CREATE OR REPLACE FUNCTION rota.errors_with(errors jsonb, attempt integer, at timestamptz, error text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_agg(e.value ORDER BY e.n), '[]'::jsonb)
    FROM (SELECT CASE WHEN jsonb_typeof(errors) = 'array' THEN errors
                      ELSE '[]'::jsonb END AS kept) AS h
    CROSS JOIN LATERAL jsonb_array_elements(
             h.kept
             || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', at, 'error', error))
         ) WITH ORDINALITY AS e(value, n)
    WHERE e.n > jsonb_array_length(h.kept) + 1 - 20
$$;
