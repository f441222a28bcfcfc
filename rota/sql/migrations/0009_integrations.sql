-- Results and history, job groups, trace context, and enqueueing from SQL.
-- Every new column is nullable with no default: adding it rewrites nothing,
-- and a job that uses none of them stores nothing more than before.

-- result: a handler's JSON return value (NULL when it returned None).
-- errors: every attempt's error, oldest first, the last 20 kept, as
--   [{"attempt": 3, "at": "...", "error": "ValueError: ..."}]; last_error stays.
-- trace_context: the W3C trace context (traceparent, tracestate) of the span
--   that enqueued the job, when OpenTelemetry is in use.
-- group_key: the job's concurrency group (a tenant, an account); stored here,
--   given limits by flow control.
ALTER TABLE rota.job
    ADD COLUMN IF NOT EXISTS group_key text,
    ADD COLUMN IF NOT EXISTS result jsonb,
    ADD COLUMN IF NOT EXISTS errors jsonb,
    ADD COLUMN IF NOT EXISTS trace_context jsonb;

ALTER TABLE rota.job_archive
    ADD COLUMN IF NOT EXISTS group_key text,
    ADD COLUMN IF NOT EXISTS result jsonb,
    ADD COLUMN IF NOT EXISTS errors jsonb,
    ADD COLUMN IF NOT EXISTS trace_context jsonb;

-- The error history with one more attempt's error, the oldest dropped past 20.
-- Called only for outcomes that carry an error (a done job calls nothing).
CREATE FUNCTION rota.errors_with(errors jsonb, attempt integer, at timestamptz, error text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_agg(e.value ORDER BY e.n), '[]'::jsonb)
    FROM jsonb_array_elements(
             coalesce(errors, '[]'::jsonb)
             || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', at, 'error', error))
         ) WITH ORDINALITY AS e(value, n)
    WHERE e.n > jsonb_array_length(coalesce(errors, '[]'::jsonb)) + 1 - 20
$$;

-- Enqueue from any client or from a trigger, in the caller's transaction:
--   SELECT rota.enqueue('email.send', '{"to": "a@example.com"}');
--   SELECT rota.enqueue('email.send', payload => '{}', key => 'welcome:42', priority => 3);
-- Checks what rota.enqueue() in Python checks (a non-empty type, priority 0 to
-- 9, at least one attempt, a payload of at most 256 KiB, no NUL) and raises
-- invalid_parameter_value (22023) otherwise. A known key inserts nothing and
-- returns the id of the job that holds it.
CREATE FUNCTION rota.enqueue(
    job_type text,
    payload jsonb DEFAULT '{}',
    key text DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT 0,
    max_attempts int DEFAULT NULL,
    group_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    IF coalesce(btrim(enqueue.job_type), '') = '' THEN
        RAISE EXCEPTION 'rota.enqueue: job type must be a non-empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 0 AND 9 THEN
        RAISE EXCEPTION 'rota.enqueue: priority must be a whole number from 0 (first) to 9, not %',
            coalesce(enqueue.priority::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND enqueue.max_attempts < 1 THEN
        RAISE EXCEPTION 'rota.enqueue: max_attempts must be at least 1: %', enqueue.max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.key = '' THEN
        RAISE EXCEPTION 'rota.enqueue: an idempotency key must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(coalesce(enqueue.payload, '{}'::jsonb)::text) > 262144 THEN
        RAISE EXCEPTION 'rota.enqueue: payload is % bytes, over the limit of 262144 bytes',
            octet_length(enqueue.payload::text)
            USING ERRCODE = 'invalid_parameter_value';
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
