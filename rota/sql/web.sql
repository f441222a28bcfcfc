-- The web console's own queries (rota.web). Each must stay cheap on a table
-- of millions of rows: the job list walks the primary key newest first within
-- a bounded window, counts and groups read the partial indexes of ready,
-- running and ended rows, and charts read rota.queue_sample
-- (tests/web/test_plans.py checks every plan over 1,000,000 jobs).

-- name: web_jobs_page
-- One page of the job list, newest first, below the cursor `before`. Status,
-- idempotency key and cursor narrow an index walk (and "retrying", ready jobs
-- past a failed attempt, the ready rows); the other filters (type, payload,
-- error text, creation time) are applied to a window of at most `scan` rows of
-- that walk when `bounded`, so a filter that matches little never reads the
-- whole table: the page then says how far it searched and offers to go on.
-- A status other than done (`sorted`) is looked for first among the newest
-- 20,000 rows below the cursor, walking the primary key as `rota jobs list`
-- does: where that status is common (the dead and failed jobs among the done
-- ones) the page is found there, a few hundred rows read. When the walk finds
-- less than the window, the window is read as before: the status's partial
-- index read whole and sorted (the sort key an expression, so that the
-- planner does not walk the primary key past every done row instead). A walk
-- that found too little costs 20,000 rows read by the primary key (some 6 ms);
-- a key or a type has an index of its own, and is not walked for.
WITH walked AS MATERIALIZED (
    SELECT id, type, payload, created_at, last_error
    FROM (SELECT id, status, attempts, type, payload, created_at, last_error
          FROM rota.job
          WHERE %(sorted)s::boolean
            AND %(key)s::text IS NULL
            AND %(type)s::text IS NULL
            AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
          ORDER BY id DESC
          LIMIT 20000) AS newest
    WHERE status = %(status)s::text
      AND (%(retrying)s::boolean IS NOT TRUE OR attempts > 0)
      AND (%(bounded)s::boolean
           OR ((%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
               AND (%(error)s::text IS NULL
                    OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
               AND (%(created_from)s::timestamptz IS NULL
                    OR created_at >= %(created_from)s::timestamptz)
               AND (%(created_to)s::timestamptz IS NULL
                    OR created_at < %(created_to)s::timestamptz)))
    ORDER BY id DESC
    LIMIT %(scan)s
),
win AS (
    SELECT id, type, payload, created_at, last_error
    FROM walked
    WHERE (SELECT count(*) FROM walked) >= %(scan)s
    UNION ALL
    (SELECT id, type, payload, created_at, last_error
     FROM rota.job
     WHERE (SELECT count(*) FROM walked) < %(scan)s
       AND (%(status)s::text IS NULL OR status = %(status)s::text)
       AND (%(retrying)s::boolean IS NOT TRUE OR attempts > 0)
       AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
       AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
       AND (%(bounded)s::boolean
            OR ((%(type)s::text IS NULL OR type = %(type)s::text)
                AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
                AND (%(error)s::text IS NULL
                     OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
                AND (%(created_from)s::timestamptz IS NULL
                     OR created_at >= %(created_from)s::timestamptz)
                AND (%(created_to)s::timestamptz IS NULL
                     OR created_at < %(created_to)s::timestamptz)))
     ORDER BY CASE WHEN %(sorted)s::boolean THEN id + 0 ELSE id END DESC
     LIMIT %(scan)s)
),
hits AS (
    SELECT id
    FROM win
    WHERE (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
      AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
      AND (%(created_from)s::timestamptz IS NULL OR created_at >= %(created_from)s::timestamptz)
      AND (%(created_to)s::timestamptz IS NULL OR created_at < %(created_to)s::timestamptz)
    ORDER BY id DESC
    LIMIT %(limit)s
)
SELECT j.id, j.type, j.status, j.priority, j.attempts, j.max_attempts, j.run_at,
       j.created_at, j.started_at, j.finished_at, j.idempotency_key, j.locked_by,
       j.locked_until,
       left(j.payload::text, 160) AS payload_text,
       left(split_part(j.last_error, E'\n', 1), 160) AS error_line,
       j.status = 'ready' AND j.attempts > 0 AS retrying,
       (SELECT count(*) FROM win) AS scanned,
       (SELECT min(id) FROM win) AS scanned_to
FROM hits JOIN rota.job AS j ON j.id = hits.id
ORDER BY j.id DESC

-- name: web_jobs_window
-- How far an empty page searched (web_jobs_page returns no row to say it).
WITH win AS (
    SELECT id
    FROM rota.job
    WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
      AND (%(retrying)s::boolean IS NOT TRUE OR attempts > 0)
      AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
      AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
    ORDER BY CASE WHEN %(sorted)s::boolean THEN id + 0 ELSE id END DESC
    LIMIT %(scan)s
)
SELECT count(*) AS scanned, min(id) AS scanned_to FROM win

-- name: web_bulk_ids
-- Every job of one status (`one`, a status an action applies to: the few
-- ready, running or ended rows, found by their partial index) that a filter
-- matches, locked for the action that follows in the same transaction. One
-- status per statement, so that each walks its own partial index.
SELECT id
FROM rota.job
WHERE status = %(one)s::text
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
  AND (%(retrying)s::boolean IS NOT TRUE OR attempts > 0)
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
  AND (%(created_from)s::timestamptz IS NULL OR created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR created_at < %(created_to)s::timestamptz)
  AND (%(delayed)s::boolean IS NOT TRUE OR run_at > coalesce(%(now)s::timestamptz, now()))
ORDER BY id
LIMIT %(cap)s
FOR UPDATE

-- name: web_bulk_count
SELECT count(*) AS jobs
FROM (
    SELECT 1
    FROM rota.job
    WHERE status = %(one)s::text
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
      AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
      AND (%(retrying)s::boolean IS NOT TRUE OR attempts > 0)
      AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
      AND (%(created_from)s::timestamptz IS NULL OR created_at >= %(created_from)s::timestamptz)
      AND (%(created_to)s::timestamptz IS NULL OR created_at < %(created_to)s::timestamptz)
      AND (%(delayed)s::boolean IS NOT TRUE OR run_at > coalesce(%(now)s::timestamptz, now()))
    LIMIT %(cap)s + 1
) AS matching

-- name: web_job_effects
-- The first %(limit)s effect markers of a job's key, each with how many there are.
SELECT effect, result, created_at, count(*) OVER () AS total
FROM rota.job_effect
WHERE job_key = %(key)s
ORDER BY created_at, effect
LIMIT %(limit)s

-- name: web_archived_job
SELECT * FROM rota.job_archive WHERE id = %(id)s

-- name: web_schedule_by_id
SELECT * FROM rota.schedule WHERE id = %(id)s

-- name: web_dead_groups
-- Dead letters by type and error class (the name before the first colon of
-- last_error), the biggest groups first; reads the dead rows only, and the
-- latest job of each group for a sample of its error.
WITH groups AS (
    SELECT type,
           coalesce(substring(last_error FROM '^[A-Za-z_][A-Za-z0-9_.]*'), '') AS error_class,
           count(*) AS jobs,
           min(finished_at) AS first_at,
           max(finished_at) AS last_at,
           max(id) AS latest_id
    FROM rota.job
    WHERE status = 'dead'
    GROUP BY 1, 2
    ORDER BY jobs DESC, type, error_class
    LIMIT %(limit)s
)
SELECT g.*, left(split_part(j.last_error, E'\n', 1), 200) AS sample
FROM groups AS g
JOIN rota.job AS j ON j.id = g.latest_id
ORDER BY g.jobs DESC, g.type, g.error_class

-- name: web_dead_group_ids
SELECT id
FROM rota.job
WHERE status = 'dead'
  AND type = %(type)s
  AND coalesce(substring(last_error FROM '^[A-Za-z_][A-Za-z0-9_.]*'), '') = %(error_class)s
ORDER BY id
LIMIT %(cap)s
FOR UPDATE

-- name: web_set_priority
-- Change the priority of ready jobs (a running job keeps its attempt's).
UPDATE rota.job
SET priority = %(priority)s
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'ready'
RETURNING id

-- name: web_run_now
-- A delayed ready job due now; wakes idle workers.
WITH moved AS (
    UPDATE rota.job
    SET run_at = coalesce(%(now)s::timestamptz, now())
    WHERE id = ANY(%(ids)s::bigint[]) AND status = 'ready'
      AND run_at > coalesce(%(now)s::timestamptz, now())
    RETURNING id
),
woken AS (
    SELECT pg_notify('rota_jobs', '') FROM moved LIMIT 1
)
SELECT id FROM moved LEFT JOIN woken ON true ORDER BY id

-- name: web_audit_insert
INSERT INTO rota.audit (at, actor, role, action, target, rows)
VALUES (coalesce(%(now)s::timestamptz, now()), %(actor)s, %(role)s, %(action)s, %(target)s,
        %(rows)s)
RETURNING id

-- name: web_audit_page
SELECT id, at, actor, role, action, target, rows
FROM rota.audit
WHERE %(before)s::bigint IS NULL OR id < %(before)s::bigint
ORDER BY id DESC
LIMIT %(limit)s

-- name: web_paused_types
SELECT type, paused_at FROM rota.paused_type ORDER BY type

-- name: web_session_insert
-- A new login session; expired ones are cleared on the way.
WITH cleared AS (
    DELETE FROM rota.web_session WHERE expires_at < coalesce(%(now)s::timestamptz, now())
)
INSERT INTO rota.web_session (id, actor, role, expires_at)
VALUES (%(id)s, %(actor)s, %(role)s, to_timestamp(%(expires)s))

-- name: web_session_alive
SELECT 1 AS alive
FROM rota.web_session
WHERE id = %(id)s AND expires_at > coalesce(%(now)s::timestamptz, now())

-- name: web_session_delete
DELETE FROM rota.web_session WHERE id = %(id)s

-- name: web_selected_ids
-- The chosen jobs (ticked on a page) of one status an action applies to,
-- locked for the action that follows in the same transaction.
SELECT id
FROM rota.job
WHERE id = ANY(%(ids)s::bigint[]) AND status = %(one)s::text
  AND (%(delayed)s::boolean IS NOT TRUE OR run_at > coalesce(%(now)s::timestamptz, now()))
ORDER BY id
FOR UPDATE

-- name: web_known_types
-- The job types the console knows of, for the type filter's suggestions: every
-- type that ever finished, is paused, is scheduled or is served by a live worker.
-- Small tables only (never rota.job).
SELECT type FROM rota.job_done_count
UNION SELECT type FROM rota.paused_type WHERE type <> '*'
UNION SELECT job_type FROM rota.schedule
UNION SELECT unnest(types) FROM rota.worker WHERE expires_at > now()
ORDER BY 1
LIMIT 500

-- name: web_schedule_key_holder
-- Why a schedule's uniqueness refused a run now: its active job (unique_active),
-- or until when its key is held (unique_for_seconds).
SELECT (SELECT id FROM rota.job
        WHERE unique_key = %(key)s AND unique_active
          AND status IN ('ready', 'running', 'waiting')) AS active_id,
       (SELECT until FROM rota.job_unique_key WHERE key = %(key)s) AS until

-- name: web_schedule_recent_jobs
-- A schedule's latest jobs, newest slot first (its slot index, walked backwards).
SELECT id, status, slot, attempts, started_at, finished_at,
       left(split_part(last_error, E'\n', 1), 160) AS error_line
FROM rota.job
WHERE schedule_id = %(id)s
ORDER BY slot DESC
LIMIT %(limit)s

-- name: web_live_worker_types
-- The types each live worker lists (an empty list: every type it registers).
SELECT types FROM rota.worker WHERE expires_at > coalesce(%(now)s::timestamptz, now())

-- name: web_chart_samples
-- The queue's samples over a range at each bucket's first minute (one
-- primary-key lookup per bucket, not every minute of seven days), from the
-- bucket before the range so that the first bucket's throughput can be told.
-- A minute without a sample is a gap in the line.
SELECT b.at, q.done_total + q.ended_total AS finished_total, q.oldest_ready_age_seconds,
       q.ready_due, q.running
FROM generate_series(
         date_bin(%(bucket)s::interval,
                  coalesce(%(now)s::timestamptz, now()) - %(span)s::interval - %(bucket)s::interval,
                  timestamptz '2000-01-01'),
         coalesce(%(now)s::timestamptz, now()),
         %(bucket)s::interval
     ) AS b(at)
-- OFFSET 0 keeps the lookups apart: joined, the planner would read the table.
CROSS JOIN LATERAL (
    SELECT * FROM rota.queue_sample AS s WHERE s.minute = b.at OFFSET 0
) AS q
ORDER BY b.at

-- name: web_chart_type_samples
-- The finished totals and oldest ready ages per job type (rota.queue_sample_type)
-- at each bucket's first minute, as web_chart_samples.
SELECT b.at, q.type, q.done_total + q.ended_total AS finished_total, q.oldest_ready_age_seconds
FROM generate_series(
         date_bin(%(bucket)s::interval,
                  coalesce(%(now)s::timestamptz, now()) - %(span)s::interval - %(bucket)s::interval,
                  timestamptz '2000-01-01'),
         coalesce(%(now)s::timestamptz, now()),
         %(bucket)s::interval
     ) AS b(at)
CROSS JOIN LATERAL (
    SELECT * FROM rota.queue_sample_type AS s WHERE s.minute = b.at OFFSET 0
) AS q
ORDER BY b.at, q.type

-- name: web_retrying_types
-- Ready jobs waiting for another attempt after a failed one (a retry resets
-- attempts to 0; a job given back does not count its attempt), by type: how
-- many, and the attempts of the one furthest along. The ready rows only.
SELECT type, count(*) AS jobs,
       (array_agg(attempts ORDER BY attempts DESC, max_attempts))[1] AS attempts,
       (array_agg(max_attempts ORDER BY attempts DESC, max_attempts))[1] AS max_attempts
FROM rota.job
WHERE status = 'ready' AND attempts > 0
GROUP BY type
ORDER BY type

-- name: web_failing_types
-- Attempts failed per type since `since` (rota.job_failure_count, migration 0028).
SELECT type, sum(count) AS failures
FROM rota.job_failure_count
WHERE minute >= date_trunc('minute', %(since)s::timestamptz)
GROUP BY type
ORDER BY type

-- name: web_chart_failures
-- Failed attempts per bucket and type over a range (the buckets of
-- web_chart_samples), read through the index on minute.
SELECT date_bin(%(bucket)s::interval, minute, timestamptz '2000-01-01') AS at, type,
       sum(count) AS failures
FROM rota.job_failure_count
WHERE minute >= date_bin(%(bucket)s::interval,
                         coalesce(%(now)s::timestamptz, now()) - %(span)s::interval,
                         timestamptz '2000-01-01')
  AND minute <= coalesce(%(now)s::timestamptz, now())
GROUP BY 1, 2
ORDER BY 1, 2
