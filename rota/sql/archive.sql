-- Moving finished jobs to rota.job_archive, one capped batch per statement so
-- no lock is held for long. SKIP LOCKED steps around rows somebody holds (a
-- `rota dead retry` in flight); their turn comes in a later run. A row is
-- deleted and inserted in the same statement: it is in exactly one table.

-- name: archive_finished
-- Rows of the given statuses finished before the retention; done rows are
-- archived after a shorter retention than failed and dead ones, which somebody
-- may still want to read or retry.
WITH picked AS (
    SELECT id FROM rota.job
    WHERE status = ANY(%(statuses)s::text[])
      AND finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM rota.job AS j USING picked WHERE j.id = picked.id RETURNING j.*
),
archived AS (
    INSERT INTO rota.job_archive (id, type, payload, idempotency_key, status, run_at, attempts,
                                  max_attempts, locked_by, locked_until, last_error, created_at,
                                  started_at, finished_at, schedule_id, slot, priority,
                                  timeout_seconds, cancel_requested_at, releases, group_key,
                                  result, errors, trace_context, archived_at)
    SELECT id, type, payload, idempotency_key, status, run_at, attempts, max_attempts,
           locked_by, locked_until, last_error, created_at, started_at, finished_at,
           schedule_id, slot, priority, timeout_seconds, cancel_requested_at, releases,
           group_key, result, errors, trace_context, coalesce(%(now)s::timestamptz, now())
    FROM moved
    RETURNING 1
)
SELECT count(*) AS moved FROM archived

-- name: delete_archived
-- Archived rows past the archive's own retention, oldest first (through
-- job_archive_archived_idx), deleted in capped batches like the moves. The
-- picked rows are reached by primary key from an array: a join may be planned
-- as a hash join over a scan of the whole archive.
WITH picked AS (
    SELECT id FROM rota.job_archive
    WHERE archived_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s)
    ORDER BY archived_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM rota.job_archive AS a WHERE a.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING 1
)
SELECT count(*) AS moved FROM deleted
