-- The core queue's statements. Times compare against coalesce(%(now)s, now()):
-- production passes NULL (the database clock), tests pass a frozen instant.

-- name: enqueue_jobs
-- One round trip for a whole batch. Ids are drawn up front so every input row
-- can be matched to its result; a duplicate key (in the table, or earlier in
-- the same batch) inserts nothing and reports the id that holds the key.
-- The payloads travel in binary (%(payloads)b): as a text array every JSON
-- document would be quoted and escaped, a third of the client's time. A batch
-- with no groups passes NULL for %(groups)s (unnest pads it with NULLs), and
-- all of a batch's jobs share one trace context (the batch's span), or none.
-- The sequence is found once per statement (an InitPlan), not once per row:
-- pg_get_serial_sequence() reads the catalogs, 2.5 us a call.
-- ON CONFLICT names the keyed rows (WHERE idempotency_key IS NOT NULL): that
-- finds the key's unique constraint and the partial unique index alike, the
-- two ways `rota migrate --key-index` keeps keys unique.
WITH input AS (
    SELECT t.ord, t.type, t.payload, t.key, t.run_at, t.delay, t.max_attempts, t.priority,
           t.timeout, t.group_key,
           nextval((SELECT pg_get_serial_sequence('rota.job', 'id')::regclass)) AS new_id
    FROM unnest(%(types)s::text[], %(payloads)b::jsonb[], %(keys)s::text[],
                %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[],
                %(priorities)s::smallint[], %(timeouts)s::float8[], %(groups)s::text[])
         WITH ORDINALITY AS t(type, payload, key, run_at, delay, max_attempts, priority, timeout,
                              group_key, ord)
),
inserted AS (
    INSERT INTO rota.job (id, type, payload, idempotency_key, run_at, max_attempts, priority,
                          timeout_seconds, created_at, group_key, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT new_id, type, payload, key,
           coalesce(run_at, coalesce(%(now)s::timestamptz, now())
                            + make_interval(secs => coalesce(delay, 0))),
           coalesce(max_attempts, %(default_max_attempts)s),
           priority, timeout,
           coalesce(%(now)s::timestamptz, now()),
           group_key, %(trace_context)s::jsonb
    FROM input
    ORDER BY ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, idempotency_key
)
-- A key held before the batch is looked up by a subquery, run only for a row
-- that made no job: as a join, a plan made while the table was small hashed
-- the whole table on every enqueue until the next ANALYZE.
SELECT i.ord,
       coalesce(mine.id, same_batch.id,
                (SELECT existing.id FROM rota.job AS existing
                 WHERE i.key IS NOT NULL AND existing.idempotency_key = i.key)) AS id,
       mine.id IS NOT NULL AS created
FROM input i
LEFT JOIN inserted mine ON mine.id = i.new_id
LEFT JOIN inserted same_batch ON i.key IS NOT NULL AND same_batch.idempotency_key = i.key
ORDER BY i.ord

-- name: enqueue_jobs_without_keys
-- enqueue_jobs for a batch in which no job has a key: no row can conflict, so
-- the INSERT is plain. ON CONFLICT inserts each row speculatively and confirms
-- it in a second WAL record (48 bytes a job), and matching the rows made back
-- to the input is a join; here every input row makes the job whose id it drew.
-- Together 0.5-2 of the batch's 9-12 us a job (bench/JOURNAL.md).
WITH input AS (
    SELECT t.ord, t.type, t.payload, t.run_at, t.delay, t.max_attempts, t.priority,
           t.timeout, t.group_key,
           nextval((SELECT pg_get_serial_sequence('rota.job', 'id')::regclass)) AS new_id
    FROM unnest(%(types)s::text[], %(payloads)b::jsonb[], %(run_ats)s::timestamptz[],
                %(delays)s::float8[], %(max_attempts)s::int[], %(priorities)s::smallint[],
                %(timeouts)s::float8[], %(groups)s::text[])
         WITH ORDINALITY AS t(type, payload, run_at, delay, max_attempts, priority, timeout,
                              group_key, ord)
),
inserted AS (
    INSERT INTO rota.job (id, type, payload, run_at, max_attempts, priority, timeout_seconds,
                          created_at, group_key, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT new_id, type, payload,
           coalesce(run_at, coalesce(%(now)s::timestamptz, now())
                            + make_interval(secs => coalesce(delay, 0))),
           coalesce(max_attempts, %(default_max_attempts)s),
           priority, timeout,
           coalesce(%(now)s::timestamptz, now()),
           group_key, %(trace_context)s::jsonb
    FROM input
    ORDER BY ord
)
SELECT new_id AS id FROM input ORDER BY ord

-- name: enqueue_job
-- One job: the same row as enqueue_jobs makes, from a statement a fraction of
-- its cost to plan and run (a third of the time of an enqueue, commit
-- included). A known key inserts nothing and returns no row. ON CONFLICT
-- names no index: every unique index arbitrates, the key's (constraint or
-- partial index, as in enqueue_jobs) and, for a job enqueued with
-- unique_active (%(unique_key)s given), job_unique_active_idx, which refuses
-- a second ready or running job with the key however many connections
-- enqueue it at once (unique_active_holder then says which job holds it).
INSERT INTO rota.job (type, payload, idempotency_key, unique_key, unique_active, run_at,
                      max_attempts, priority, timeout_seconds, created_at, group_key,
                      trace_context)
VALUES (%(type)s, %(payload)s, %(idempotency_key)s, %(unique_key)s, %(unique_active)s,
        coalesce(%(run_at)s::timestamptz,
                 coalesce(%(now)s::timestamptz, now())
                 + make_interval(secs => coalesce(%(delay)s::float8, 0))),
        coalesce(%(max_attempts)s::int, %(default_max_attempts)s),
        %(priority)s::smallint, %(timeout)s::float8,
        coalesce(%(now)s::timestamptz, now()),
        %(group)s::text, %(trace_context)s::jsonb)
ON CONFLICT DO NOTHING
RETURNING id

-- name: enqueue_job_without_key
-- enqueue_job for a job with no key that is not unique: no unique index can
-- refuse it, so the INSERT is plain (no speculative insertion, 48 bytes of WAL
-- less).
INSERT INTO rota.job (type, payload, run_at, max_attempts, priority, timeout_seconds,
                      created_at, group_key, trace_context)
VALUES (%(type)s, %(payload)s,
        coalesce(%(run_at)s::timestamptz,
                 coalesce(%(now)s::timestamptz, now())
                 + make_interval(secs => coalesce(%(delay)s::float8, 0))),
        coalesce(%(max_attempts)s::int, %(default_max_attempts)s),
        %(priority)s::smallint, %(timeout)s::float8,
        coalesce(%(now)s::timestamptz, now()),
        %(group)s::text, %(trace_context)s::jsonb)
RETURNING id

-- name: unique_active_holder
SELECT id FROM rota.job
WHERE unique_key = %(key)s AND unique_active AND status IN ('ready', 'running', 'waiting')

-- name: enqueue_unique_for
-- One job whose key is unique for a window after the first job with it. The
-- key's row in rota.job_unique_key is taken over only once its window has
-- passed: ON CONFLICT DO UPDATE waits for a concurrent enqueue of the key and
-- judges its row, so exactly one of them makes a job. No row returned: the
-- key is held (unique_for_holder says by which job).
WITH held AS (
    INSERT INTO rota.job_unique_key (key, job_id, until)
    VALUES (%(key)s, nextval(pg_get_serial_sequence('rota.job', 'id')),
            coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(unique_for)s))
    ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, until = excluded.until
        WHERE rota.job_unique_key.until <= coalesce(%(now)s::timestamptz, now())
    RETURNING job_id
)
INSERT INTO rota.job (id, type, payload, unique_key, run_at, max_attempts, priority,
                      timeout_seconds, created_at, group_key, trace_context)
OVERRIDING SYSTEM VALUE
SELECT held.job_id, %(type)s, %(payload)s, %(key)s,
       coalesce(%(run_at)s::timestamptz,
                coalesce(%(now)s::timestamptz, now())
                + make_interval(secs => coalesce(%(delay)s::float8, 0))),
       coalesce(%(max_attempts)s::int, %(default_max_attempts)s),
       %(priority)s::smallint, %(timeout)s::float8,
       coalesce(%(now)s::timestamptz, now()),
       %(group)s::text, %(trace_context)s::jsonb
FROM held
RETURNING id

-- name: unique_for_holder
SELECT job_id AS id FROM rota.job_unique_key WHERE key = %(key)s

-- name: ids_for_keys
SELECT idempotency_key, id FROM rota.job WHERE idempotency_key = ANY(%(keys)s::text[])

-- name: claim_jobs
-- Select, lock and mark in one statement. SKIP LOCKED lets any number of
-- workers claim side by side; the attempt is counted at claim time so a job
-- that kills its worker every time still ends in dead. Priorities are strict:
-- the lateral scan walks job_claim_idx one priority at a time (0 first), each
-- a range scan that stops at the first job not yet due, and the outer LIMIT
-- stops as soon as enough jobs are locked. Paused types are never claimed.
-- Given types are written into the statement as a literal, not bound (see
-- rota.claim._claim_statement); NULL claims any type.
-- The since array, when given, is where each priority's walk starts (an array of ten
-- run_at values, NULL for "from the first"): a worker's claims start just
-- behind the jobs it claimed last, past the index entries of every job claimed
-- before, which a long transaction elsewhere keeps alive (see rota.claim.Floor).
-- It is written as a row comparison, a bound of the index walk all the same:
-- as `run_at >= ...` beside `run_at <= now()` the planner takes the pair for a
-- narrow range (its bound is unknown when planned) and prefers sorting a bitmap
-- scan of the type index over the ordered walk (28,000 rows for a claim of
-- 100 in tests/integration/test_control.py).
-- Jobs of types with a limit (rota.job_limit) are picked first, by
-- rota.pick_limited (migrations 0013, 0020, 0021, 0032), which holds each limit
-- exact across workers and returns each job with the slot it starts in (its
-- walk of each type's jobs without a group starts where limited_since says,
-- a JSON object of ten run_at values per type, see rota.floor.Floor); the
-- walk below skips those types, and when no limit applies to the types
-- claimed the function is not called at all: unlimited types pay one look at
-- the small limits table. One UPDATE starts every job picked, and its
-- RETURNING is the statement's result.
WITH limited AS MATERIALIZED (
    SELECT l.id, l.limit_slot
    FROM rota.pick_limited(coalesce(%(now)s::timestamptz, now()), %(types)s::text[], %(limit)s,
                           %(limited_since)s::jsonb) AS l
    WHERE EXISTS (SELECT FROM rota.job_limit
                  WHERE %(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
),
picked AS (
    SELECT c.id
    FROM generate_series(0, 9) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT id
        FROM rota.job
        WHERE status = 'ready'
          AND priority = p.priority
          AND (run_at, id) >= (coalesce((%(since)s::timestamptz[])[p.priority + 1], '-infinity'), 0)
          AND run_at <= coalesce(%(now)s::timestamptz, now())
          AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
          AND type <> ALL (SELECT type FROM rota.paused_type)
          AND type <> ALL (SELECT type FROM rota.job_limit)
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE NOT EXISTS (SELECT FROM rota.paused_type WHERE type = '*')
    LIMIT %(limit)s - (SELECT count(*) FROM limited)
)
-- The picked rows are reached by primary key from an array, never joined: a
-- join may be planned as a hash join over a sequential scan of the whole table
-- (a generic plan that cannot see the limit, or a custom one for a large batch
-- on a table of some ten thousand rows), which costs every claim the table.
UPDATE rota.job AS j
SET status = 'running',
    locked_by = %(worker)s,
    locked_until = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease)s),
    attempts = j.attempts + 1,
    claims = j.claims + 1,
    started_at = coalesce(%(now)s::timestamptz, now()),
    -- Both arrays read the materialized rows in the order they were stored.
    limit_slot = (ARRAY(SELECT l.limit_slot FROM limited AS l))
                 [array_position(ARRAY(SELECT l.id FROM limited AS l), j.id)]
WHERE j.id = ANY(ARRAY(SELECT id FROM picked) || ARRAY(SELECT id FROM limited))
-- The columns of a Job, in its order, so that the worker builds each one
-- positionally.
RETURNING j.id, j.type, j.payload, j.idempotency_key, j.status, j.run_at, j.attempts,
          j.max_attempts, j.locked_by, j.locked_until, j.last_error, j.created_at,
          j.started_at, j.finished_at, j.schedule_id, j.slot, j.priority, j.timeout_seconds,
          j.cancel_requested_at, j.releases, j.trace_context, j.group_key, j.claims

-- name: claim_floor
-- The first ready job of each priority that the claim would take (NULL where
-- there is none), for rota.claim.Floor: a job ready behind where a worker's
-- claims start (a paused type resumed, a claim rolled back, a run_at in the
-- past) moves that start back. The same walk and the same types as the claim.
SELECT p.priority, f.run_at
FROM generate_series(0, 9) AS p(priority)
LEFT JOIN LATERAL (
    SELECT run_at
    FROM rota.job
    WHERE status = 'ready'
      AND priority = p.priority
      AND run_at <= coalesce(%(now)s::timestamptz, now())
      AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
      AND type <> ALL (SELECT type FROM rota.paused_type)
      AND type <> ALL (SELECT type FROM rota.job_limit)
    ORDER BY run_at, id
    LIMIT 1
) AS f ON true
WHERE NOT EXISTS (SELECT FROM rota.paused_type WHERE type = '*')

-- name: limited_types
SELECT type FROM rota.job_limit

-- name: limited_floor
-- The first due ready job without a group of each priority of each limited
-- type (none where there is none), for rota.floor.Floor: the walk of
-- rota.pick_limited's jobs without a group, from the first entry. A function
-- (migration 0035), so that it is planned with sorting off.
SELECT type, priority, run_at
FROM rota.limited_floor(coalesce(%(now)s::timestamptz, now()), %(types)s::text[])

-- name: extend_leases
-- Heartbeat: extend the leases this worker still holds, each by the number of
-- its claim (migration 0041); a missing id in the result is a lease lost. It also brings back which of them somebody asked to
-- cancel, so a worker learns of a cancel request with no query of its own.
-- Driven from the batch: each row is reached by its primary key (see
-- write_outcomes for why the arrays go through subqueries and the status
-- test is written as it is).
UPDATE rota.job AS j
SET locked_until = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease)s)
FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(claims)s::int[])) AS h(id, claims)
WHERE j.id = h.id
  AND j.status IS NOT DISTINCT FROM 'running'
  AND j.locked_by = %(worker)s
  AND j.claims = h.claims
RETURNING j.id, j.claims, j.cancel_requested_at IS NOT NULL AS cancel_requested

-- name: write_outcomes
-- Record outcomes of a batch of jobs. Each update holds only if the row is
-- still running, locked by this worker, under the same claim (its number,
-- which nothing lowers, not the attempt's, which a give-back or a retry
-- lowers): a run whose lease was taken away changes nothing.
--   done      -> done
--   failed    -> failed (permanent error)
--   retry     -> ready again after delay, or dead at max_attempts
--   dead      -> dead at once (a row the worker cannot read)
--   released  -> ready again after delay, the attempt not counted (shutdown, outage)
--   cancelled -> cancelled
-- A job somebody asked to cancel never runs again: a retry or a release of it
-- is written as cancelled (a done or failed outcome stands).
-- The rows moved into done are counted here, a row appended to
-- rota.job_done_count per type (every row written was running before, so none
-- leaves done; the queue's minute sample folds the rows, migration 0016).
WITH written AS (
    UPDATE rota.job AS j
    SET status = CASE
            WHEN f.outcome IN ('retry', 'released') AND j.cancel_requested_at IS NOT NULL
                THEN 'cancelled'
            WHEN f.outcome = 'retry' AND j.attempts >= j.max_attempts THEN 'dead'
            WHEN f.outcome IN ('retry', 'released') THEN 'ready'
            ELSE f.outcome
        END,
        run_at = CASE
            WHEN f.outcome = 'retry' AND j.attempts >= j.max_attempts THEN j.run_at  -- dead
            WHEN f.outcome IN ('retry', 'released') AND j.cancel_requested_at IS NULL
                THEN coalesce(%(now)s::timestamptz, now()) + make_interval(secs => f.delay)
            ELSE j.run_at
        END,
        attempts = CASE WHEN f.outcome = 'released' THEN j.attempts - 1 ELSE j.attempts END,
        releases = CASE WHEN f.outcome = 'released' THEN j.releases + 1 ELSE 0 END,
        last_error = coalesce(f.error, j.last_error),
        errors = CASE WHEN f.error IS NULL THEN j.errors
                      ELSE rota.errors_with(j.errors, j.attempts,
                                            coalesce(%(now)s::timestamptz, now()), f.error) END,
        result = coalesce(f.result, j.result),
        locked_until = NULL,
        finished_at = CASE
            WHEN f.outcome IN ('done', 'failed', 'cancelled', 'dead')
              OR (f.outcome IN ('retry', 'released') AND j.cancel_requested_at IS NOT NULL)
              OR (f.outcome = 'retry' AND j.attempts >= j.max_attempts)
                THEN coalesce(%(now)s::timestamptz, now())
        END
    -- %(results)s is NULL for a batch with no results (unnest pads it with NULLs).
    FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(claims)s::int[]),
                (SELECT %(outcomes)s::text[]), (SELECT %(delays)s::float8[]),
                (SELECT %(errors)s::text[]), (SELECT %(results)s::jsonb[]))
         AS f(id, claims, outcome, delay, error, result)
    -- The plan is driven from the batch and reaches each row by its primary key,
    -- whether planned for these values or generic (psycopg prepares a statement on
    -- its sixth run). Each array is passed through a subquery (an InitPlan) so
    -- that no plan is made for the batch's size: planned for 150 or more values
    -- on a table whose statistics say nothing runs, the batch was joined to a
    -- sequential scan of the table that rescanned the batch for every row it
    -- found (70 ms for 500 outcomes on 20,000 rows, 7 ms now). The status test
    -- does not match the partial index of running rows on purpose: statistics
    -- taken while nothing ran estimate one running row, and a generic plan that
    -- may walk that index rescans the batch for every running row. Status is
    -- NOT NULL, so the test means status = 'running'.
    WHERE j.id = f.id
      AND j.status IS NOT DISTINCT FROM 'running'
      AND j.locked_by = %(worker)s
      AND j.claims = f.claims
    RETURNING j.id, f.claims, j.status, j.type, j.limit_slot
),
counted AS (
    INSERT INTO rota.job_done_count (type, count)
    SELECT type, count(*)
    FROM written
    WHERE status = 'done'
    GROUP BY type
),
-- A slot of a limit that held a claim back came free: idle workers wake to
-- claim the jobs it held back (one notification per transaction, folded by
-- PostgreSQL). A limit that held nothing back wakes nobody: a commit that
-- notifies takes a lock of the whole cluster (migration 0021). The limits and
-- slots holding back are read once for the batch (each IN is one hashed
-- subplan), not probed for every job written.
woken AS (
    SELECT pg_notify('rota_jobs', '')
    WHERE EXISTS (
        SELECT FROM written
        WHERE written.type IN (SELECT l.type FROM rota.job_limit AS l WHERE l.held_back)
           OR (written.type, written.limit_slot) IN (
                  SELECT ls.type, ls.slot FROM rota.job_limit_slot AS ls WHERE ls.held_back))
)
SELECT id, claims, status FROM written LEFT JOIN woken ON true

-- name: running_of_worker
-- A worker's running rows: few (its slots and a batch claimed ahead), found
-- among the running rows only (job_running_idx).
SELECT id, attempts, claims FROM rota.job WHERE status = 'running' AND locked_by = %(worker)s

-- name: job_states
SELECT id, status, locked_by, attempts, claims FROM rota.job WHERE id = ANY(%(ids)s::bigint[])

-- name: store_completed_results
-- The return values of jobs their handlers completed themselves (rota.complete
-- in their own transaction), written once the handlers returned: only where
-- the row is done under this worker and the same claim, and holds no result
-- (one given to rota.complete stays).
UPDATE rota.job AS j
SET result = r.result::jsonb
FROM unnest(%(ids)s::bigint[], %(claims)s::int[], %(results)s::text[]) AS r(id, claims, result)
WHERE j.id = r.id
  AND j.status = 'done'
  AND j.locked_by = %(worker)s
  AND j.claims = r.claims
  AND j.result IS NULL

-- name: reap_expired
-- Give expired leases back: ready again after the job's backoff (the attempt
-- counted, as rota.retry.backoff_seconds computes it for a failed one: base *
-- 2^(attempts-1), capped, +/- jitter), or dead once the attempts are used up.
-- A durable job whose run stored a step since it was claimed made progress:
-- its attempt is not counted (attempts - 1, as a release does) and it is ready
-- at once, unless %(max_releases)s give-backs in a row went uncounted (a job
-- that kills its worker after each new step still ends). A run that stored
-- nothing new is charged, so a job that kills its worker before its next step
-- ends dead as any other.
-- Capped batches and SKIP LOCKED keep many reapers out of each other's way;
-- each expiration is counted in its UTC hour. A job of a limited type that
-- leaves running frees a slot, and wakes idle workers as an outcome does.
WITH lapsed AS (
    SELECT j.id
    FROM rota.job AS j
    WHERE j.status = 'running' AND j.locked_until < coalesce(%(now)s::timestamptz, now())
    ORDER BY j.locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
-- A running row without a lease (an INSERT or UPDATE written by hand) has none
-- that anyone renews: it is given back as a lapsed one is. Apart, so that each
-- walk is a range of job_running_idx (an OR of the two reads every running row).
leaseless AS (
    SELECT j.id
    FROM rota.job AS j
    WHERE j.status = 'running' AND j.locked_until IS NULL
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
expired AS MATERIALIZED (
    SELECT j.id,
           'LeaseExpired: worker ' || coalesce(j.locked_by, '?')
               || ' stopped renewing its lease during attempt ' || j.attempts AS error,
           j.releases < %(max_releases)s
               AND EXISTS (SELECT FROM rota.job_step AS s
                           WHERE s.job_id = j.id AND s.finished_at >= j.started_at)
               AS progressed
    FROM rota.job AS j
    WHERE j.id IN (SELECT id FROM lapsed UNION ALL SELECT id FROM leaseless)
),
reset AS (
    UPDATE rota.job AS j
    SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN expired.progressed THEN 'ready'
                      WHEN j.attempts >= j.max_attempts THEN 'dead'
                      ELSE 'ready' END,
        run_at = CASE
            WHEN j.cancel_requested_at IS NOT NULL
                 OR (j.attempts >= j.max_attempts AND NOT expired.progressed)
                THEN j.run_at  -- ended: the time it was due stays
            ELSE coalesce(%(now)s::timestamptz, now()) + CASE
                WHEN expired.progressed THEN interval '0'
                ELSE make_interval(secs => greatest(0, least(
                    %(cap)s::float8,
                    least(%(cap)s::float8,
                          %(base)s::float8 * power(2, least(greatest(j.attempts - 1, 0), 60)))
                    * (1 + %(jitter)s::float8 * (2 * random() - 1)))))
                END
            END,
        attempts = CASE WHEN expired.progressed THEN j.attempts - 1 ELSE j.attempts END,
        releases = CASE WHEN expired.progressed THEN j.releases + 1 ELSE 0 END,
        locked_until = NULL,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                             OR (j.attempts >= j.max_attempts AND NOT expired.progressed)
                           THEN coalesce(%(now)s::timestamptz, now()) END,
        last_error = expired.error || CASE WHEN expired.progressed
                                           THEN ' (not counted: the run stored a step)'
                                           ELSE '' END,
        errors = rota.errors_with(j.errors, j.attempts, coalesce(%(now)s::timestamptz, now()),
                                  expired.error)
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.status, j.type, expired.progressed
),
counted AS (
    INSERT INTO rota.lease_expiration (hour, count)
    SELECT date_trunc('hour', coalesce(%(now)s::timestamptz, now()), 'UTC'), count(*)
    FROM reset
    HAVING count(*) > 0
    ON CONFLICT (hour) DO UPDATE SET count = rota.lease_expiration.count + excluded.count
),
-- A slot of a limited type came free, or a durable job is ready at once: idle
-- workers wake to claim (see write_outcomes).
woken AS (
    SELECT pg_notify('rota_jobs', '')
    WHERE EXISTS (SELECT FROM reset JOIN rota.job_limit AS l ON l.type = reset.type)
       OR EXISTS (SELECT FROM reset WHERE reset.progressed AND reset.status = 'ready')
)
SELECT id, status, type FROM reset LEFT JOIN woken ON true

-- name: reaper_next_due
-- How long until the reaper has something to do: the earliest lease to expire
-- (a renewed lease moves on; a dead worker's stays where it was) or waiting job
-- to come due, through the partial indexes of running and waiting rows. NULL
-- when there is neither.
SELECT least((SELECT min(locked_until) FROM rota.job WHERE status = 'running'),
             (SELECT min(run_at) FROM rota.job WHERE status = 'waiting'))
       - now() AS wait

-- name: list_jobs
-- The newest jobs, of one status and type when given. The type index holds
-- every version but the running ones (migration 0023), so the running jobs are
-- read apart, among the running rows; each part stops at the limit, and a part
-- the status rules out is not read at all (its one-time filter is false).
SELECT *
FROM ((SELECT *
       FROM rota.job
       WHERE status <> 'running'
         AND %(status)s::text IS DISTINCT FROM 'running'
         AND (%(status)s::text IS NULL OR status = %(status)s::text)
         AND (%(type)s::text IS NULL OR type = %(type)s::text)
       ORDER BY id DESC
       LIMIT %(limit)s)
      UNION ALL
      (SELECT *
       FROM rota.job
       WHERE status = 'running'
         AND coalesce(%(status)s::text, 'running') = 'running'
         AND (%(type)s::text IS NULL OR type = %(type)s::text)
       ORDER BY id DESC
       LIMIT %(limit)s)) AS j
ORDER BY id DESC
LIMIT %(limit)s

-- name: get_job
SELECT * FROM rota.job WHERE id = %(id)s

-- name: get_archived_job
SELECT * FROM rota.job_archive WHERE id = %(id)s

-- name: job_outcome
-- What became of a job, from rota.job or, once archived, the archive. JSON comes
-- as text, decoded by Rota whatever loaders the connection has (Django's leave
-- jsonb as text).
SELECT type, status, payload::text AS payload, result::text AS result,
       errors::text AS errors, attempts, locked_by, created_at, started_at, finished_at
FROM rota.job WHERE id = %(id)s
UNION ALL
SELECT type, status, payload::text, result::text, errors::text, attempts, locked_by,
       created_at, started_at, finished_at
FROM rota.job_archive WHERE id = %(id)s
LIMIT 1

-- name: queue_age
-- Age of the oldest job that could run now, how many could, and how many run;
-- walks the partial indexes of ready, waiting and running rows only. Jobs of
-- paused types cannot run now: they are not counted as waiting; nor are the
-- jobs of the types in %(held)s, whose limits hold jobs back (more workers
-- would not start them sooner). A waiting job whose time has come (a sleep
-- ended, a wait timed out) counts as ready: a pool scaled to zero must start a
-- worker, whose reaper makes it ready; a job still waiting counts nowhere.
WITH due AS (
    SELECT run_at, type FROM rota.job
    WHERE status = 'ready' AND run_at <= coalesce(%(now)s::timestamptz, now())
    UNION ALL
    SELECT run_at, type FROM rota.job
    WHERE status = 'waiting' AND run_at <= coalesce(%(now)s::timestamptz, now())
)
SELECT coalesce(extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(run_at)), 0)::float8
           AS oldest_ready_age_seconds,
       count(*) AS ready_jobs,
       (SELECT count(*) FROM rota.job
        WHERE status = 'running'
          AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))) AS running_jobs
FROM due
WHERE (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND type <> ALL (SELECT type FROM rota.paused_type)
  AND type <> ALL (%(held)s::text[])
  AND NOT EXISTS (SELECT FROM rota.paused_type WHERE type = '*')

-- name: paused_among
-- The paused types among the given ones (all paused types when none given);
-- '*' when every type is paused.
SELECT type FROM rota.paused_type
WHERE type = '*' OR %(types)s::text[] IS NULL OR type = ANY(%(types)s::text[])
ORDER BY type

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

-- name: ping
-- An answer from the server: a listener checks its quiet connection with it.
SELECT 1
