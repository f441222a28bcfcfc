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

-- name: delete_expired_unique_keys
-- Keys of unique_for (rota.job_unique_key) whose window passed longer ago than
-- the retention, oldest first (job_unique_key_until_idx), in capped batches. An
-- enqueue takes such a key over anyway (enqueue_unique_for: ON CONFLICT DO
-- UPDATE ... WHERE until <= now), so the row refuses nothing; deleting it must
-- still never let the key be taken twice inside a window:
-- - A row an enqueue is taking over right now is locked: SKIP LOCKED passes
--   over it (its new window keeps it), and this statement never waits for an
--   enqueue. An enqueue of a key this statement deletes waits for it to commit,
--   then inserts a new row: a new window, as taking the old row over would be.
-- - A row taken over after this statement's snapshot is locked in its newest
--   version and judged again (READ COMMITTED's recheck): its new window keeps it.
-- - A schedule's key (schedule:<id>) is judged by slot time, not by the clock:
--   a scheduler that comes back late judges its missed slot against the window,
--   so the row stays while the schedule's next slot comes before its end.
-- The retention covers an enqueue whose transaction began inside the window:
-- it judges the key by its transaction's start.
WITH picked AS (
    SELECT k.key FROM rota.job_unique_key AS k
    WHERE k.until < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s)
      -- Written with OR so that it stays a test of each row (not a join that
      -- reads every expired row before the LIMIT), asked of schedule keys only.
      AND (NOT starts_with(k.key, 'schedule:')
           OR NOT EXISTS (SELECT FROM rota.schedule AS s
                          WHERE 'schedule:' || s.id = k.key AND s.next_run_at < k.until))
    ORDER BY k.until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM rota.job_unique_key AS k
    WHERE k.key = ANY(ARRAY(SELECT key FROM picked))
    RETURNING 1
)
SELECT count(*) AS moved FROM deleted
