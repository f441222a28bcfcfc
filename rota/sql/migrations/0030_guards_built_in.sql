-- The guards of migration 0029, written into each WHEN clause with built-in
-- functions only. PostgreSQL makes a trigger's WHEN clause ready once per
-- statement, and inlines an SQL function there by parsing its body again:
-- rota.job_fits() and the four functions under it cost every statement that
-- fires the trigger 0.12-0.14 ms of the server's time, whatever its rows (a
-- third of a one-job enqueue; a worker's outcome statement, whose SET names
-- run_at, paid it too). Written out, the insert's guard costs about 0.05 ms a
-- statement (each operator or function in it, about a microsecond to make
-- ready) and under a microsecond a row.
--
-- The rules are those of 0029, and the guards do what they did: each is false
-- or NULL for a row within the limits of docs/limits.md and true for a row
-- past one, which then calls rota.job_checked() (0024) for the refusal and its
-- message. A name fits when it has a character other than white space
-- (Python's str.isspace(), the set of rota.blank()) and at most 1,024 bytes;
-- one that starts with a printable ASCII character (nearly all) is decided by
-- it, as in rota.blank(), before the regular expression is asked.
-- Each rule is written once below and put into the triggers that ask it;
-- tests/promises/test_input_checks.py runs each trigger as defined against
-- rota.job_checked() on values at and past every edge.

DROP TRIGGER job_checked_insert ON rota.job;
DROP TRIGGER job_checked_fields ON rota.job;
DROP TRIGGER job_checked_payload ON rota.job;

DO $migration$
DECLARE
    not_space constant text :=
        E'[^\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004'
        '\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000]';
    column_name text;
    fields_fit text := 'NEW.type IS NOT NULL';
    payload_fits constant text := $$
        NOT jsonb_path_exists(NEW.payload,
                'strict $.**{100} ? (@.type() == "array" || @.type() == "object")')
        AND octet_length(NEW.payload::text) <= 262144$$;
BEGIN
    FOREACH column_name IN ARRAY ARRAY['type', 'idempotency_key', 'unique_key', 'group_key'] LOOP
        fields_fit := fields_fit
            || format(' AND (ascii(NEW.%1$I) BETWEEN 33 AND 126 OR NEW.%1$I ~ %2$L)'
                      ' AND octet_length(NEW.%1$I) <= 1024', column_name, not_space);
    END LOOP;
    fields_fit := fields_fit || $$
        AND NEW.run_at BETWEEN '1970-01-01T00:00:00Z' AND '9999-12-30T00:00:00Z'
        AND NEW.priority IS NOT NULL AND NEW.priority BETWEEN 0 AND 9
        AND NEW.max_attempts >= 1
        AND NEW.timeout_seconds <> 'NaN' AND NEW.timeout_seconds > 0
        AND NEW.timeout_seconds <= 315360000$$;

    EXECUTE format($$
        CREATE TRIGGER job_checked_insert BEFORE INSERT ON rota.job
            FOR EACH ROW WHEN (NOT (%s AND %s))
            EXECUTE FUNCTION rota.job_checked('all')$$, fields_fit, payload_fits);
    -- An update that leaves the checked columns as they were is passed over, so
    -- an old row that breaks a rule does not fail it. The payload is not looked
    -- at here: its own trigger checks it when it changes.
    EXECUTE format($$
        CREATE TRIGGER job_checked_fields
            BEFORE UPDATE OF type, idempotency_key, unique_key, group_key, run_at, priority,
                             max_attempts, timeout_seconds ON rota.job
            FOR EACH ROW
            WHEN ((OLD.type, OLD.idempotency_key, OLD.unique_key, OLD.group_key, OLD.run_at,
                   OLD.priority, OLD.max_attempts, OLD.timeout_seconds)
                  IS DISTINCT FROM (NEW.type, NEW.idempotency_key, NEW.unique_key,
                                    NEW.group_key, NEW.run_at, NEW.priority,
                                    NEW.max_attempts, NEW.timeout_seconds)
                  AND NOT (%s))
            EXECUTE FUNCTION rota.job_checked('fields')$$, fields_fit);
    EXECUTE format($$
        CREATE TRIGGER job_checked_payload BEFORE UPDATE OF payload ON rota.job
            FOR EACH ROW WHEN (OLD.payload IS DISTINCT FROM NEW.payload AND NOT (%s))
            EXECUTE FUNCTION rota.job_checked('payload')$$, payload_fits);
END
$migration$;

DROP FUNCTION rota.job_fits(text, text, text, text, timestamptz, smallint, integer,
                            double precision, jsonb);
DROP FUNCTION rota.name_fits(text), rota.payload_fits(jsonb), rota.instant_fits(timestamptz);
