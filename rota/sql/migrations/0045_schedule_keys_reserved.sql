-- The keys of a schedule's jobs are the schedule's alone.
--
-- A slot's job is keyed 'schedule:<id>:<slot>', and the jobs of a schedule
-- with unique_for or unique_active share the key 'schedule:<id>'. Both can be
-- guessed, and any writer could take them first: rota.enqueue() in SQL (a role
-- given only --grant-enqueue), the Python API, a plain INSERT or UPDATE. A job
-- enqueued ahead under a slot's key made the scheduler's insert do nothing (it
-- logged "0 job(s) enqueued" and moved past the slot), and one under
-- 'schedule:<id>' with a window of ten years made a unique-for schedule skip
-- every slot; the built-in rota/archive schedule could be stopped so. A job's
-- idempotency key or unique key that starts with 'schedule:' is now refused
-- (22023, as every input rule) unless it is a key of the job's own schedule:
-- 'schedule:<schedule_id>:...' for the idempotency key, 'schedule:<schedule_id>'
-- for the unique key.
--
-- The rule is asked where the other rules of these columns are: in the guards
-- of 0031 (built-in functions only, a trigger called only for a row that
-- breaks a rule), on an INSERT and on an UPDATE that changes a key. An update
-- of schedule_id alone is not checked (the job of a removed schedule keeps its
-- key whatever is done to it), and the claim and outcome statements, which
-- write neither key, call nothing more. Rows already in the table are left as
-- they are.

CREATE OR REPLACE FUNCTION rota.job_checked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
    -- On INSERT (mode 'all') every column is written; OLD is NULL there.
    every constant boolean := TG_ARGV[0] = 'all';
    reserved constant text := 'an idempotency key must not start with ''schedule:'''
                              ' (the prefix is reserved for the jobs of schedules)';
BEGIN
    IF TG_ARGV[0] <> 'payload' THEN
        problem := coalesce(
            CASE WHEN every OR OLD.type IS DISTINCT FROM NEW.type THEN
                coalesce(CASE WHEN NEW.type IS NULL
                              THEN 'job type must be a non-empty string, not NULL' END,
                         rota.name_problem(NEW.type, 'job type')) END,
            CASE WHEN every OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key THEN
                coalesce(rota.name_problem(NEW.idempotency_key, 'an idempotency key'),
                         CASE WHEN starts_with(NEW.idempotency_key, 'schedule:')
                                   AND NOT (starts_with(NEW.idempotency_key, 'schedule:'
                                                        || NEW.schedule_id::text || ':') IS TRUE)
                              THEN reserved END) END,
            CASE WHEN every OR OLD.unique_key IS DISTINCT FROM NEW.unique_key THEN
                coalesce(rota.name_problem(NEW.unique_key, 'an idempotency key'),
                         CASE WHEN starts_with(NEW.unique_key, 'schedule:')
                                   AND NOT ((NEW.unique_key = 'schedule:'
                                                              || NEW.schedule_id::text) IS TRUE)
                              THEN reserved END) END,
            CASE WHEN every OR OLD.group_key IS DISTINCT FROM NEW.group_key
                THEN rota.name_problem(NEW.group_key, 'a group') END,
            CASE WHEN every OR OLD.run_at IS DISTINCT FROM NEW.run_at
                THEN rota.instant_problem(NEW.run_at, 'run_at') END,
            CASE WHEN (every OR OLD.priority IS DISTINCT FROM NEW.priority)
                      AND (NEW.priority IS NULL OR NEW.priority NOT BETWEEN 0 AND 9)
                THEN format('priority must be a whole number from 0 (first) to 9, not %s',
                            coalesce(NEW.priority::text, 'NULL')) END,
            CASE WHEN (every OR OLD.max_attempts IS DISTINCT FROM NEW.max_attempts)
                      AND NEW.max_attempts < 1
                THEN format('max_attempts must be a whole number of at least 1, not %s',
                            NEW.max_attempts) END,
            CASE WHEN (every OR OLD.timeout_seconds IS DISTINCT FROM NEW.timeout_seconds)
                      AND (NEW.timeout_seconds = 'NaN' OR NEW.timeout_seconds <= 0
                           OR NEW.timeout_seconds > 315360000)
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

-- The guards of 0031, made again from the same rules, the keys' with the
-- prefix: true or NULL for a key within the rules (NULL where it is NULL).
DROP TRIGGER job_checked_insert ON rota.job;
DROP TRIGGER job_checked_fields ON rota.job;

DO $migration$
DECLARE
    not_space constant text :=
        E'[^\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004'
        '\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000]';
    name_fits constant text :=
        '(ascii(NEW.%1$I) BETWEEN 33 AND 126 OR NEW.%1$I ~ %2$L)'
        ' AND octet_length(NEW.%1$I) <= 1024';
    rules constant jsonb := jsonb_build_object(
        'type', 'NEW.type IS NOT NULL AND ' || format(name_fits, 'type', not_space),
        'idempotency_key', format(name_fits, 'idempotency_key', not_space)
            || $$ AND (NOT starts_with(NEW.idempotency_key, 'schedule:')
                       OR starts_with(NEW.idempotency_key,
                                      'schedule:' || NEW.schedule_id::text || ':') IS TRUE)$$,
        'unique_key', format(name_fits, 'unique_key', not_space)
            || $$ AND (NOT starts_with(NEW.unique_key, 'schedule:')
                       OR (NEW.unique_key = 'schedule:' || NEW.schedule_id::text) IS TRUE)$$,
        'group_key', format(name_fits, 'group_key', not_space),
        'run_at', $$NEW.run_at BETWEEN '1970-01-01T00:00:00Z' AND '9999-12-30T00:00:00Z'$$,
        'priority', 'NEW.priority IS NOT NULL AND NEW.priority BETWEEN 0 AND 9',
        'max_attempts', 'NEW.max_attempts >= 1',
        'timeout_seconds', $$NEW.timeout_seconds <> 'NaN' AND NEW.timeout_seconds > 0
                             AND NEW.timeout_seconds <= 315360000$$,
        'payload', $$NOT jsonb_path_exists(NEW.payload,
                         'strict $.**{100} ? (@.type() == "array" || @.type() == "object")')
                     AND octet_length(NEW.payload::text) <= 262144$$);
    fields constant text[] := ARRAY['type', 'idempotency_key', 'unique_key', 'group_key',
                                    'priority', 'max_attempts', 'timeout_seconds'];
BEGIN
    EXECUTE format($$
        CREATE TRIGGER job_checked_insert BEFORE INSERT ON rota.job
            FOR EACH ROW WHEN (NOT (%s))
            EXECUTE FUNCTION rota.job_checked('all')$$,
        (SELECT string_agg(format('(%s)', rule), ' AND ') FROM jsonb_each_text(rules) AS r(c, rule)));
    EXECUTE format($$
        CREATE TRIGGER job_checked_fields BEFORE UPDATE OF %s ON rota.job
            FOR EACH ROW WHEN (%s)
            EXECUTE FUNCTION rota.job_checked('fields')$$,
        array_to_string(fields, ', '),
        (SELECT string_agg(format('(OLD.%1$I IS DISTINCT FROM NEW.%1$I AND NOT (%2$s))',
                                  c, rules ->> c), ' OR ')
         FROM unnest(fields) AS c));
END
$migration$;
