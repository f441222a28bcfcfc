-- The rules of a schedule's cron expression, group, timeout, unique_for window
-- and next run, kept by the database as the Python API keeps them.
--
-- rota.schedule_store.validate refuses a cron expression Python cannot read, a
-- blank group, a timeout or a window of Infinity or NaN. The table checked only
-- the names and the payload (0024), so a plain INSERT or UPDATE stored the
-- rest, and the schedule then looked fine in `rota schedule list` and never
-- made a job: at every due slot the scheduler logged "cannot be computed" (the
-- cron expression) or "the database refused its slot" (the job's own rules
-- refused its group or timeout). A next_run_at of infinity is never due, so the
-- schedule stops without a word; one of -infinity is no time Python can hold,
-- and the scheduler passes over a slot that never was, counted as missed.
-- The table's trigger now refuses each of these with 22023 and Python's reason:
--
--   group_key           the rule of a job's group (rota.name_problem, 'a group');
--   timeout_seconds     the rule of a job's timeout: more than 0 and at most
--                       315,360,000 seconds (rota.limits.timeout_seconds); NaN
--                       too, which the column's CHECK let in (NaN > 0 is true);
--   unique_for_seconds  rota.limits.unique's window, within the same bounds;
--   next_run_at         the range of a job's run_at, 1970-01-01 to 9999-12-30
--                       UTC (rota.instant_problem): no infinity either way;
--   cron                an expression by its shape (rota.cron_problem).
--
-- The shape: at most 1,024 bytes (rota.cron.parse refuses a longer text too),
-- then one of rota.cron.MACROS in any case, or five fields between white space
-- (Python's str.split() characters, the set of rota.blank()), each made of
-- digits, letters and * , - / ? ( ). Python stays the parser: the shape never
-- refuses an expression rota.cron.Schedule accepts, and where the shape finds
-- the problem its reason is Python's, word for word for a text in ASCII
-- (tests/promises/test_schedule_rules.py draws expressions to prove both).
--
-- Two rules stay Python's alone. The time zone: the server's time zone database
-- may be older than the one the scheduler reads, and refusing a zone the
-- scheduler knows would be worse than the line it logs for one it does not.
-- The names under rota/: the operator's namespaced names may start with it.
--
-- An UPDATE is checked on the columns whose values it changes, as rota.job is
-- since 0031. The scheduler's advance writes next_run_at, and a row that breaks
-- a rule in another column (stored before this migration, or with triggers
-- off) must still be moved past its slots: checked whole, the advance of a cron
-- expression the scheduler cannot compute would be refused, and with it the
-- scheduler's tick. No CHECK is added and the rows already stored are left as
-- they are: a bad schedule stops no other, the scheduler passes over it.

-- A text as Python's repr() shows it, so that a reason quoting a value reads as
-- Python's: between single quotes (double quotes when it holds a ' and no "),
-- a backslash and the quote escaped, tab, newline and carriage return as \t \n
-- \r, and every other character outside printable ASCII as \xNN, \uNNNN or
-- \UNNNNNNNN. (Python shows the printable characters of other scripts as they
-- are; here they are escaped too, so a reason never carries a control
-- character or a change of writing direction.)
CREATE FUNCTION rota.python_repr(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT q.quote || coalesce(string_agg(
               CASE
                   WHEN c.ch = E'\\' OR c.ch = q.quote THEN E'\\' || c.ch
                   WHEN c.ch = E'\t' THEN E'\\t'
                   WHEN c.ch = E'\n' THEN E'\\n'
                   WHEN c.ch = E'\r' THEN E'\\r'
                   WHEN ascii(c.ch) BETWEEN 32 AND 126 THEN c.ch
                   WHEN ascii(c.ch) < 256 THEN E'\\x' || lpad(to_hex(ascii(c.ch)), 2, '0')
                   WHEN ascii(c.ch) < 65536 THEN E'\\u' || lpad(to_hex(ascii(c.ch)), 4, '0')
                   ELSE E'\\U' || lpad(to_hex(ascii(c.ch)), 8, '0')
               END, '' ORDER BY c.n), '') || q.quote
    FROM (SELECT CASE WHEN strpos(value, E'\'') > 0 AND strpos(value, '"') = 0
                      THEN '"' ELSE E'\'' END AS quote) AS q
    -- '' splits into one empty piece: no character.
    LEFT JOIN LATERAL regexp_split_to_table(value, '') WITH ORDINALITY AS c(ch, n)
        ON c.ch <> ''
    GROUP BY q.quote
$$;

-- A cron expression by its shape, as above. NULL when the shape is fine (the
-- expression may still be one Python refuses: a minute of 61, say) or the
-- value is NULL (the column's business).
CREATE FUNCTION rota.cron_problem(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN value IS NULL THEN NULL
        WHEN octet_length(value) > 1024
            THEN format('cron expression is %s bytes long, over the limit of 1024',
                        octet_length(value))
        WHEN left(e.shown, 1) = '@' THEN
            -- Python's str.lower(): of the letters outside ASCII, only the
            -- Kelvin sign becomes one of a macro's (k).
            CASE WHEN translate(e.shown, E'ABCDEFGHIJKLMNOPQRSTUVWXYZ\u212a',
                                'abcdefghijklmnopqrstuvwxyzk')
                      NOT IN ('@yearly', '@annually', '@monthly', '@weekly', '@daily',
                              '@midnight', '@hourly')
                THEN format('invalid cron expression %s: unknown macro',
                            rota.python_repr(e.shown)) END
        WHEN cardinality(e.fields) <> 5
            -- Python splits '' into one empty field.
            THEN format('invalid cron expression %s: expected 5 fields, got %s',
                        rota.python_repr(e.shown), greatest(cardinality(e.fields), 1))
        ELSE (SELECT format('invalid cron expression %s: %s field %s: not a valid value',
                            rota.python_repr(e.shown),
                            (ARRAY['minute', 'hour', 'day of month', 'month', 'day of week'])[i],
                            rota.python_repr(e.fields[i]))
              FROM generate_series(1, 5) AS i
              WHERE translate(e.fields[i],
                              '0123456789abcdefghijklmnopqrstuvwxyz'
                              'ABCDEFGHIJKLMNOPQRSTUVWXYZ*,-/?()', '') <> ''
              ORDER BY i
              LIMIT 1)
    END
    FROM (SELECT f.fields, array_to_string(f.fields, ' ') AS shown
          FROM (SELECT ARRAY(
                    SELECT t.field
                    FROM regexp_split_to_table(
                             value,
                             E'[\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \u0085\u00a0\u1680\u2000\u2001'
                             '\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028'
                             '\u2029\u202f\u205f\u3000]+') WITH ORDINALITY AS t(field, n)
                    WHERE t.field <> ''
                    ORDER BY t.n) AS fields) AS f) AS e
$$;

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

DROP TRIGGER schedule_checked ON rota.schedule;
CREATE TRIGGER schedule_checked
    BEFORE INSERT OR UPDATE OF name, job_type, cron, payload, timeout_seconds, group_key,
                               unique_for_seconds, next_run_at
    ON rota.schedule FOR EACH ROW EXECUTE FUNCTION rota.names_checked();
