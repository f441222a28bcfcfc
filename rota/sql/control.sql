-- Job control: retry, cancel, pause and resume. Every statement that makes
-- jobs runnable wakes idle workers on channel rota_jobs.

-- name: retry_jobs
-- Bring ended jobs (dead, failed or cancelled) back to ready with a fresh set
-- of attempts; the last error stays for the record. Given ids: those of them
-- in the statuses. Without ids (`retry --all`): one capped batch of the oldest
-- of one status, through job_ended_idx; revived rows leave the status, so the
-- next batch starts from the beginning again, past the jobs earlier batches
-- left (%(skip)s: rota/control.py keeps them, so none is taken twice).
-- A job enqueued with unique_active comes back only while no ready or running
-- job holds its key, and of several with one key in the batch, the newest:
-- its key's unique index (job_unique_active_idx) admits one active job. Every
-- candidate comes back as a row: revived, or why not (held_by: the active job
-- that holds its key; newer: the job of the batch revived with that key). A
-- holder enqueued while this runs makes the UPDATE fail on the unique index;
-- rota/control.py runs the batch again, which then names it.
WITH candidates AS (
    SELECT id, unique_key, unique_active FROM rota.job
    WHERE status = ANY(%(statuses)s::text[])
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND NOT id = ANY(coalesce(%(skip)s::bigint[], '{}'))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE
),
keyed AS (
    SELECT c.id,
           (SELECT held.id FROM rota.job AS held
            WHERE held.unique_key = c.unique_key AND held.unique_active
              AND held.status IN ('ready', 'running', 'waiting')
            LIMIT 1) AS held_by,
           (SELECT max(o.id) FROM candidates AS o
            WHERE o.unique_active AND o.unique_key = c.unique_key) AS newest
    FROM candidates AS c
    WHERE c.unique_active
),
picked AS (
    SELECT c.id FROM candidates AS c LEFT JOIN keyed AS k ON k.id = c.id
    WHERE NOT c.unique_active OR (k.held_by IS NULL AND k.newest = c.id)
),
revived AS (
    UPDATE rota.job AS j
    SET status = 'ready',
        run_at = coalesce(%(now)s::timestamptz, now()),
        attempts = 0,
        locked_until = NULL,
        finished_at = NULL,
        cancel_requested_at = NULL
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING j.id
),
woken AS (
    SELECT pg_notify('rota_jobs', '') FROM revived LIMIT 1
)
SELECT c.id, r.id IS NOT NULL AS revived, k.held_by,
       CASE WHEN k.held_by IS NULL AND k.newest <> c.id THEN k.newest END AS newer
FROM candidates AS c
LEFT JOIN revived AS r ON r.id = c.id
LEFT JOIN keyed AS k ON k.id = c.id
LEFT JOIN woken ON true
ORDER BY c.id

-- name: existing_job_ids
SELECT id FROM rota.job WHERE id = ANY(%(ids)s::bigint[])

-- name: archived_job_ids
SELECT id FROM rota.job_archive WHERE id = ANY(%(ids)s::bigint[])

-- name: cancel_jobs
-- A ready or waiting job ends cancelled at once; a running one gets a cancel
-- request that its worker reads from its next heartbeat. The children of a
-- job cancelled by id (durable jobs, rota.job.parent_id), and theirs, are
-- cancelled with it. %(status)s (NULL: any) is asked of the ids given only,
-- not of their children. The rows are locked first (not skipped), so a job being
-- claimed right now is seen as the claim left it, and in id order, the order
-- of every statement that waits for the locks of running rows (a worker's
-- outcomes and heartbeats), so none of them deadlock.
WITH RECURSIVE family AS (
    SELECT unnest(%(ids)s::bigint[]) AS id
    UNION
    SELECT c.id FROM family AS f JOIN rota.job AS c ON c.parent_id = f.id
),
target AS (
    SELECT id, status
    FROM rota.job
    WHERE status IN ('ready', 'running', 'waiting')
      AND id = ANY(ARRAY(SELECT id FROM family))
      AND (%(status)s::text IS NULL OR status = %(status)s::text
           OR id <> ALL(%(ids)s::bigint[]))
    ORDER BY id
    FOR UPDATE
),
ended AS (
    UPDATE rota.job AS j
    SET status = 'cancelled',
        cancel_requested_at = coalesce(%(now)s::timestamptz, now()),
        finished_at = coalesce(%(now)s::timestamptz, now()),
        last_error = coalesce(j.last_error, CASE t.status WHEN 'waiting'
                                                THEN 'Cancelled: while it waited'
                                                ELSE 'Cancelled: before it started' END)
    FROM target AS t
    WHERE j.id = t.id AND t.status IN ('ready', 'waiting')
    RETURNING j.id
),
requested AS (
    UPDATE rota.job AS j
    SET cancel_requested_at = coalesce(j.cancel_requested_at,
                                       coalesce(%(now)s::timestamptz, now()))
    FROM target AS t
    WHERE j.id = t.id AND t.status = 'running'
    RETURNING j.id
)
SELECT id, true AS ended FROM ended
UNION ALL
SELECT id, false FROM requested
ORDER BY id

-- name: cancellable_of_type
-- `jobs cancel --type`: the type's ready, waiting and running jobs (or those
-- of one status), in id order, read by one statement and locking nothing. A
-- job that moves between these statuses while the command runs (a lease
-- reaped, a sleep that ended, a suspension) is in exactly one of them here,
-- and cancel_jobs then takes it by id whatever its status has become; read by
-- one statement a status at a time, such a job was in none. Each branch walks
-- its status's partial index.
SELECT id FROM rota.job
WHERE status = 'ready' AND type = %(type)s::text
  AND (%(status)s::text IS NULL OR %(status)s::text = 'ready')
UNION ALL
SELECT id FROM rota.job
WHERE status = 'waiting' AND type = %(type)s::text
  AND (%(status)s::text IS NULL OR %(status)s::text = 'waiting')
UNION ALL
SELECT id FROM rota.job
WHERE status = 'running' AND type = %(type)s::text
  AND (%(status)s::text IS NULL OR %(status)s::text = 'running')
ORDER BY id

-- name: pause_types
INSERT INTO rota.paused_type (type, paused_at)
SELECT t, coalesce(%(now)s::timestamptz, now()) FROM unnest(%(types)s::text[]) AS t
ON CONFLICT (type) DO NOTHING
RETURNING type

-- name: resume_types
-- NULL types: resume everything (every type, and the pause of all types).
WITH resumed AS (
    DELETE FROM rota.paused_type
    WHERE %(types)s::text[] IS NULL OR type = ANY(%(types)s::text[])
    RETURNING type
),
woken AS (
    SELECT pg_notify('rota_jobs', '') FROM resumed LIMIT 1
)
SELECT type FROM resumed LEFT JOIN woken ON true ORDER BY type

-- name: paused_types
SELECT type, paused_at FROM rota.paused_type ORDER BY type
