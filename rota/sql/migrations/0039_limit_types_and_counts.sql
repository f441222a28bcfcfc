-- A limit's job type is never '*', at every door; counts fold past a bigint.
--
-- rota.set_limit and `rota limit set` refuse the type '*' (the row of
-- rota.paused_type that pauses every type is named so, and a limit binds one
-- job type), but a plain INSERT or UPDATE of rota.job_limit stored it: then
-- rota.clear_limit could not name the limit it had to remove. The trigger of
-- the limits now refuses it with Python's reason (22023). A row already named
-- '*' is left as it is.
--
-- Each row of rota.job_done_count and rota.job_failure_count holds a bigint,
-- and their sum may not: rows past that (written by hand) made every fold
-- fail, and with it the sample of the minute each worker writes. A fold now
-- keeps at most the largest bigint, as the readers of the sums show it.

CREATE OR REPLACE FUNCTION rota.names_checked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
    -- On INSERT every column is written (OLD is NULL there); an UPDATE of a
    -- schedule is checked on the columns whose values it changes.
    every constant boolean := TG_OP = 'INSERT';
BEGIN
    IF TG_TABLE_NAME = 'schedule' THEN
        problem := coalesce(
            CASE WHEN every OR OLD.name IS DISTINCT FROM NEW.name
                THEN rota.name_problem(NEW.name, 'schedule name') END,
            CASE WHEN every OR OLD.job_type IS DISTINCT FROM NEW.job_type
                THEN rota.name_problem(NEW.job_type, 'job type') END,
            CASE WHEN every OR OLD.cron IS DISTINCT FROM NEW.cron
                THEN rota.cron_problem(NEW.cron) END,
            CASE WHEN every OR OLD.payload IS DISTINCT FROM NEW.payload
                THEN rota.payload_problem(NEW.payload, 'payload') END,
            CASE WHEN (every OR OLD.timeout_seconds IS DISTINCT FROM NEW.timeout_seconds)
                      AND (NEW.timeout_seconds = 'NaN' OR NEW.timeout_seconds <= 0
                           OR NEW.timeout_seconds > 315360000)
                THEN format('timeout_seconds must be more than 0 and at most 315360000'
                            ' seconds, not %s', NEW.timeout_seconds) END,
            CASE WHEN every OR OLD.group_key IS DISTINCT FROM NEW.group_key
                THEN rota.name_problem(NEW.group_key, 'a group') END,
            CASE WHEN (every OR OLD.unique_for_seconds IS DISTINCT FROM NEW.unique_for_seconds)
                      AND (NEW.unique_for_seconds = 'NaN' OR NEW.unique_for_seconds <= 0
                           OR NEW.unique_for_seconds > 315360000)
                THEN format('unique_for must be more than 0 and at most 315360000'
                            ' seconds, not %s', NEW.unique_for_seconds) END,
            CASE WHEN every OR OLD.next_run_at IS DISTINCT FROM NEW.next_run_at
                THEN rota.instant_problem(NEW.next_run_at, 'next_run_at') END);
    ELSIF TG_TABLE_NAME = 'job_event' THEN
        problem := coalesce(CASE WHEN NEW.key IS NULL
                                 THEN 'event key must be a non-empty string, not NULL' END,
                            rota.name_problem(NEW.key, 'event key'),
                            rota.payload_problem(NEW.payload, 'payload'));
    ELSIF TG_TABLE_NAME = 'job_limit' THEN
        -- NaN is above every number here, as in the CHECK.
        problem := coalesce(
            rota.name_problem(NEW.type, 'job type'),
            CASE WHEN NEW.type = '*' THEN 'limits are per job type: ''*'' is not a job type' END,
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

CREATE OR REPLACE FUNCTION rota.fold_done_counts() RETURNS bigint
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM rota.job_done_count RETURNING type, count
    ),
    folded AS (
        INSERT INTO rota.job_done_count (type, count)
        SELECT type, least(sum(count), 9223372036854775807) FROM gone
        GROUP BY type HAVING sum(count) <> 0
    )
    SELECT count(*) FROM gone
$$;

CREATE OR REPLACE FUNCTION rota.fold_failure_counts(before timestamptz, keep_since timestamptz)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.job_failure_count WHERE minute < keep_since
    ),
    gone AS (
        DELETE FROM rota.job_failure_count
        WHERE minute < before AND minute >= before - interval '1 hour'
        RETURNING minute, type, count
    ),
    folded AS (
        INSERT INTO rota.job_failure_count (minute, type, count)
        SELECT minute, type, least(sum(count), 9223372036854775807) FROM gone
        GROUP BY minute, type
    )
    SELECT count(*) FROM gone
$$;

-- An archived job's status is one the readers know (rota.job's rule). Any
-- role the workers run as may insert into the archive; a row of another status
-- failed `rota jobs show` and the console's job page. NOT VALID: rows already
-- archived are not read again at migration (the archive may be large).
ALTER TABLE rota.job_archive ADD CONSTRAINT job_archive_status_check
    CHECK (status IN ('ready', 'running', 'waiting', 'done', 'failed', 'dead', 'cancelled'))
    NOT VALID;
