-- The core queue's statements. Times compare against coalesce(%(now)s, now()):
-- production passes NULL (the database clock), tests pass a frozen instant.

-- name: enqueue_jobs
-- One round trip for a whole batch. Ids are drawn up front so every input row
-- can be matched to its result; a duplicate key (in the table, or earlier in
-- the same batch) inserts nothing and reports the id that holds the key.
WITH input AS (
    SELECT t.ord, t.type, t.payload, t.key, t.run_at, t.delay, t.max_attempts,
           nextval(pg_get_serial_sequence('rota.job', 'id')) AS new_id
    FROM unnest(%(types)s::text[], %(payloads)s::jsonb[], %(keys)s::text[],
                %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[])
         WITH ORDINALITY AS t(type, payload, key, run_at, delay, max_attempts, ord)
),
inserted AS (
    INSERT INTO rota.job (id, type, payload, idempotency_key, run_at, max_attempts, created_at)
    OVERRIDING SYSTEM VALUE
    SELECT new_id, type, payload, key,
           coalesce(run_at, coalesce(%(now)s::timestamptz, now())
                            + make_interval(secs => coalesce(delay, 0))),
           coalesce(max_attempts, %(default_max_attempts)s),
           coalesce(%(now)s::timestamptz, now())
    FROM input
    ORDER BY ord
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, idempotency_key
)
SELECT i.ord,
       coalesce(mine.id, same_batch.id, existing.id) AS id,
       mine.id IS NOT NULL AS created
FROM input i
LEFT JOIN inserted mine ON mine.id = i.new_id
LEFT JOIN inserted same_batch ON i.key IS NOT NULL AND same_batch.idempotency_key = i.key
LEFT JOIN rota.job existing ON i.key IS NOT NULL AND existing.idempotency_key = i.key
ORDER BY i.ord

-- name: ids_for_keys
SELECT idempotency_key, id FROM rota.job WHERE idempotency_key = ANY(%(keys)s::text[])

-- name: claim_jobs
-- Select, lock and mark in one statement. SKIP LOCKED lets any number of
-- workers claim side by side; the attempt is counted at claim time so a job
-- that kills its worker every time still ends in dead.
WITH picked AS (
    SELECT id
    FROM rota.job
    WHERE status = 'ready'
      AND run_at <= coalesce(%(now)s::timestamptz, now())
      AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE rota.job AS j
SET status = 'running',
    locked_by = %(worker)s,
    locked_until = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease)s),
    attempts = j.attempts + 1,
    started_at = coalesce(%(now)s::timestamptz, now())
FROM picked
WHERE j.id = picked.id
RETURNING j.*

-- name: extend_leases
-- Heartbeat: extend the leases this worker still holds; a missing id in the
-- result is a lease lost.
UPDATE rota.job AS j
SET locked_until = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease)s)
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS h(id, attempts)
WHERE j.id = h.id
  AND j.id = ANY(%(ids)s::bigint[])
  AND j.status = 'running'
  AND j.locked_by = %(worker)s
  AND j.attempts = h.attempts
RETURNING j.id

-- name: finish_jobs
-- Record outcomes of a batch of jobs. Each update holds only if the row is
-- still running, locked by this worker, at the same attempt: a worker whose
-- lease was taken away changes nothing.
--   done     -> done
--   failed   -> failed (permanent error)
--   retry    -> ready again after delay, or dead at max_attempts
--   release  -> ready again at once, the attempt not counted (shutdown, outage)
UPDATE rota.job AS j
SET status = CASE
        WHEN f.outcome = 'retry' AND j.attempts >= j.max_attempts THEN 'dead'
        WHEN f.outcome IN ('retry', 'release') THEN 'ready'
        ELSE f.outcome
    END,
    run_at = CASE
        WHEN f.outcome IN ('retry', 'release')
            THEN coalesce(%(now)s::timestamptz, now()) + make_interval(secs => f.delay)
        ELSE j.run_at
    END,
    attempts = CASE WHEN f.outcome = 'release' THEN j.attempts - 1 ELSE j.attempts END,
    last_error = coalesce(f.error, j.last_error),
    locked_until = NULL,
    finished_at = CASE
        WHEN f.outcome IN ('done', 'failed')
          OR (f.outcome = 'retry' AND j.attempts >= j.max_attempts)
            THEN coalesce(%(now)s::timestamptz, now())
    END
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(outcomes)s::text[],
            %(delays)s::float8[], %(errors)s::text[]) AS f(id, attempts, outcome, delay, error)
WHERE j.id = f.id
  -- Lets the planner reach the rows by primary key; statistics rarely know
  -- how many rows are running and would otherwise join all of this worker's.
  AND j.id = ANY(%(ids)s::bigint[])
  AND j.status = 'running'
  AND j.locked_by = %(worker)s
  AND j.attempts = f.attempts
RETURNING j.id, j.status, j.type, j.attempts, j.started_at, j.finished_at

-- name: job_states
SELECT id, status, locked_by, attempts FROM rota.job WHERE id = ANY(%(ids)s::bigint[])

-- name: reap_expired
-- Give expired leases back: ready again, or dead once the attempts are used
-- up. Capped batches and SKIP LOCKED keep many reapers out of each other's way;
-- each expiration is counted in its UTC hour.
WITH expired AS (
    SELECT id
    FROM rota.job
    WHERE status = 'running' AND locked_until < coalesce(%(now)s::timestamptz, now())
    ORDER BY locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
reset AS (
    UPDATE rota.job AS j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
        run_at = coalesce(%(now)s::timestamptz, now()),
        locked_until = NULL,
        finished_at = CASE WHEN j.attempts >= j.max_attempts
                           THEN coalesce(%(now)s::timestamptz, now()) END,
        last_error = 'LeaseExpired: worker ' || coalesce(j.locked_by, '?')
                     || ' stopped renewing its lease during attempt ' || j.attempts
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.status, j.type
),
counted AS (
    INSERT INTO rota.lease_expiration (hour, count)
    SELECT date_trunc('hour', coalesce(%(now)s::timestamptz, now()), 'UTC'), count(*)
    FROM reset
    HAVING count(*) > 0
    ON CONFLICT (hour) DO UPDATE SET count = rota.lease_expiration.count + excluded.count
)
SELECT id, status, type FROM reset

-- name: retry_dead
-- Bring dead jobs back to ready with a fresh set of attempts; the last error
-- stays for the record.
WITH revived AS (
    UPDATE rota.job
    SET status = 'ready',
        run_at = coalesce(%(now)s::timestamptz, now()),
        attempts = 0,
        locked_until = NULL,
        finished_at = NULL
    WHERE status = 'dead' AND (%(all)s OR id = ANY(%(ids)s::bigint[]))
    RETURNING id
),
woken AS (
    SELECT pg_notify('rota_jobs', '') FROM revived LIMIT 1
)
SELECT id FROM revived LEFT JOIN woken ON true ORDER BY id

-- name: list_jobs
SELECT id, type, status, attempts, max_attempts, run_at, locked_by, locked_until,
       created_at, finished_at, idempotency_key, left(last_error, 200) AS last_error
FROM rota.job
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
ORDER BY id DESC
LIMIT %(limit)s

-- name: get_job
SELECT * FROM rota.job WHERE id = %(id)s

-- name: queue_age
-- Age of the oldest job that could run now, how many could, and how many run;
-- walks the partial indexes of ready and running rows only.
SELECT coalesce(extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(run_at)), 0)::float8
           AS oldest_ready_age_seconds,
       count(*) AS ready_jobs,
       (SELECT count(*) FROM rota.job
        WHERE status = 'running'
          AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))) AS running_jobs
FROM rota.job
WHERE status = 'ready'
  AND run_at <= coalesce(%(now)s::timestamptz, now())
  AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))

-- name: record_effect
INSERT INTO rota.job_effect (job_key, effect, result)
VALUES (%(key)s, %(effect)s, %(result)s)
ON CONFLICT (job_key, effect) DO NOTHING
RETURNING created_at

-- name: get_effect
SELECT result, created_at FROM rota.job_effect WHERE job_key = %(key)s AND effect = %(effect)s

-- name: listen_jobs
-- Idle workers wait for this channel (see the job_notify_ready trigger).
LISTEN rota_jobs
