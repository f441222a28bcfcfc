-- rota.enqueue() inserts a job without a key with a plain INSERT, as the
-- Python API has since 0.4 (the named statements enqueue_job_without_key and
-- enqueue_jobs_without_keys).
--
-- Under ON CONFLICT every row is inserted speculatively: written, then
-- confirmed by a second WAL record (48 bytes a job) once no conflict was
-- found. A job without a key can conflict with nothing, so it no longer pays
-- for the arbitration. A key still goes through ON CONFLICT, which holds it
-- against a rival inserting the same key at the same moment.
--
-- The body is 0024's otherwise; CREATE OR REPLACE keeps the function's owner
-- and the EXECUTE that `rota migrate --grant-enqueue` gave.
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
    IF enqueue.key IS NULL THEN
        INSERT INTO rota.job AS j (type, payload, run_at, priority, max_attempts, group_key)
        VALUES (enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
                coalesce(enqueue.run_at, now()), enqueue.priority,
                coalesce(enqueue.max_attempts, 20), enqueue.group_key)
        RETURNING j.id INTO new_id;
        RETURN new_id;
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
