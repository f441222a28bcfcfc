-- Durable jobs: steps, waits, events and children (migration 0025,
-- rota/durable.py). A run's writes are conditional on its lease, as outcomes
-- are (its worker and its claim's number, migration 0041): a run whose lease
-- was taken away stores nothing.

-- name: steps_of_job
-- Every completed step of a job, read once by a run before its first step.
-- Sent through the run's raw cursor, as save_step is: $1 job.
SELECT name, result FROM rota.job_step WHERE job_id = $1::bigint

-- name: save_step
-- A step completed: stored once, in the transaction of whatever the step
-- wrote through the run's connection, if the lease is still held; the result
-- as stored comes back, read as later runs read it (steps_of_job), so that
-- the first run returns the same value. No row: the lease is gone (or the
-- step was stored already), roll back. The statement a run sends most, so its parameters are
-- positional, sent through a raw cursor (no named-parameter conversion):
-- $1 job, $2 name, $3 result, $4 the claim's number, $5 seconds the step
-- took, $6 worker, $7 now (NULL: the database's clock). The step records the
-- attempt it was stored in, read from the row.
INSERT INTO rota.job_step (job_id, name, result, attempt, started_at, finished_at)
SELECT $1::bigint, $2::text, $3::jsonb, j.attempts,
       coalesce($7::timestamptz, now()) - make_interval(secs => $5::float8),
       coalesce($7::timestamptz, now())
FROM rota.job AS j
WHERE j.id = $1::bigint AND j.status = 'running' AND j.locked_by = $6::text
  AND j.claims = $4::int
ON CONFLICT (job_id, name) DO NOTHING
RETURNING result

-- name: wait_payload
-- The payload a wait ended by 'event' got, kept on the wait's row (migration
-- 0044): the event itself may be deleted since (the archive's event
-- retention), or its key emitted anew. An emit without a payload is kept as
-- JSON null; SQL NULL (`kept` false) is a wait that ended before 0044 whose
-- event was gone by then.
SELECT payload IS NOT NULL AS kept, payload FROM rota.job_wait
WHERE job_id = %(job)s AND name = %(name)s

-- name: children_known
SELECT child_id FROM rota.job_child
WHERE parent_id = %(parent)s AND child_id = ANY(%(ids)s::bigint[])

-- name: suspend
-- rota.suspend, unless somebody asked to cancel the job while it ran: then
-- 'cancelled', nothing written (the job runs on, and its worker writes it
-- cancelled). The job's row is locked first, as rota.cancel locks it: a cancel
-- committed before is seen here, one after finds the job waiting and ends it.
SELECT CASE
    WHEN (SELECT j.cancel_requested_at IS NOT NULL FROM rota.job AS j
          WHERE j.id = %(job)s AND j.status = 'running' AND j.locked_by = %(worker)s
            AND j.claims = %(claim)s
          FOR NO KEY UPDATE)
        THEN 'cancelled'
    ELSE rota.suspend(%(job)s, %(claim)s, %(worker)s, %(name)s, %(kind)s, %(key)s,
                      %(children)s::bigint[], %(seconds)s::float8, %(now)s::timestamptz)
END AS state

-- name: emit
SELECT rota.emit(%(key)s, %(payload)s::jsonb) AS woken

-- name: spawn_child
-- A child, once per parent and name: the name's row in rota.job_child is
-- taken with the child's id drawn up front, and the child is made only by
-- the statement that took it. The parent's row is locked first, as
-- rota.cancel locks it, and no child is made unless the parent still runs
-- under this claim (`held`) with no cancel requested (`free`): a cancel
-- committed before is seen here, one after finds the child and cancels it
-- with its parent. `id` NULL with `free` true: the name was taken before
-- (child_of_name says by which child).
WITH parent AS (
    SELECT j.cancel_requested_at IS NULL AS free
    FROM rota.job AS j
    WHERE j.id = %(parent)s AND j.status = 'running' AND j.locked_by = %(worker)s
      AND j.claims = %(claim)s
    FOR NO KEY UPDATE
),
taken AS (
    INSERT INTO rota.job_child (parent_id, name, child_id)
    SELECT %(parent)s, %(name)s, nextval(pg_get_serial_sequence('rota.job', 'id'))
    FROM parent
    WHERE parent.free
    ON CONFLICT (parent_id, name) DO NOTHING
    RETURNING child_id
),
made AS (
    INSERT INTO rota.job (id, type, payload, run_at, max_attempts, priority, timeout_seconds,
                          created_at, group_key, parent_id)
    OVERRIDING SYSTEM VALUE
    SELECT taken.child_id, %(type)s, %(payload)s,
           coalesce(%(run_at)s::timestamptz,
                    coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => coalesce(%(delay)s::float8, 0))),
           coalesce(%(max_attempts)s::int, %(default_max_attempts)s),
           %(priority)s::smallint, %(timeout)s::float8,
           coalesce(%(now)s::timestamptz, now()),
           %(group)s::text, %(parent)s
    FROM taken
    RETURNING id
)
SELECT EXISTS (SELECT FROM parent) AS held, coalesce((SELECT free FROM parent), false) AS free,
       (SELECT id FROM made) AS id

-- name: reopen_gather
-- A gather that ended while one of its children is active again (brought back
-- by a retry): open once more, so that the run's next suspend waits for it and
-- the child's end wakes the job (rota.child_ended). Only the run that holds
-- the job's lease opens it; no row back: it does not.
UPDATE rota.job_wait AS w SET ended_at = NULL, ended_by = NULL
FROM rota.job AS j
WHERE w.job_id = %(job)s AND w.name = %(name)s AND w.kind = 'children'
  AND j.id = w.job_id AND j.status = 'running' AND j.locked_by = %(worker)s
  AND j.claims = %(claim)s
RETURNING w.job_id

-- name: child_of_name
SELECT child_id AS id FROM rota.job_child WHERE parent_id = %(parent)s AND name = %(name)s

-- name: children_outcomes
-- The status, result and last error of some children, from rota.job or,
-- once archived, the archive (results as text: decoded by Rota).
SELECT id, status, result::text AS result, last_error FROM rota.job
WHERE id = ANY(%(ids)s::bigint[]) AND parent_id = %(parent)s
UNION ALL
SELECT a.id, a.status, a.result::text, a.last_error FROM rota.job_archive AS a
WHERE a.id = ANY(%(ids)s::bigint[])
  AND NOT EXISTS (SELECT FROM rota.job AS j WHERE j.id = a.id)
  AND EXISTS (SELECT FROM rota.job_child AS c
              WHERE c.parent_id = %(parent)s AND c.child_id = a.id)

-- name: wake_rechecked
-- The waiters of keys an emit could not see them for (rota.wake_rechecked,
-- migration 0042): ended by 'event', their jobs ready.
SELECT id FROM rota.wake_rechecked(%(limit)s) AS id

-- name: wake_due
-- Waiting jobs whose time has come are ready again (a sleep ended, a wait
-- timed out): one capped batch, oldest first, through job_waiting_idx, under
-- SKIP LOCKED so that several passes never wait on each other. Their waits
-- that reached their deadline end by 'time' (the run that comes back reads
-- it: a sleep done, a wait timed out). Idle workers are woken.
WITH due AS (
    SELECT id FROM rota.job
    WHERE status = 'waiting' AND run_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
woken AS (
    -- Due since run_at, which is in the past unless a test's clock runs ahead
    -- (then due now, by the database clock that the claim reads).
    UPDATE rota.job AS j SET status = 'ready', run_at = least(j.run_at, now())
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING j.id, j.type
),
ended AS (
    UPDATE rota.job_wait AS w
    SET ended_at = coalesce(%(now)s::timestamptz, now()), ended_by = 'time'
    FROM woken
    WHERE w.job_id = woken.id AND w.ended_at IS NULL
      AND w.until <= coalesce(%(now)s::timestamptz, now())
),
notified AS (
    SELECT pg_notify('rota_jobs', '') WHERE EXISTS (SELECT FROM woken)
)
SELECT id, type FROM woken LEFT JOIN notified ON true

-- name: job_steps
-- A job's steps for `rota jobs show` and the console, in the order they ended:
-- the last %(limit)s of them (all for NULL), each with how many there are.
SELECT * FROM (
    SELECT name, attempt, started_at, finished_at,
           octet_length(result::text) AS result_bytes, left(result::text, 200) AS result,
           count(*) OVER () AS total
    FROM rota.job_step WHERE job_id = %(job)s
    ORDER BY finished_at DESC, name DESC
    LIMIT %(limit)s
) AS last
ORDER BY finished_at, name

-- name: job_waits
-- The last %(limit)s waits, as the steps.
SELECT * FROM (
    SELECT name, kind, event_key, cardinality(children) AS children, until, started_at,
           ended_at, ended_by, count(*) OVER () AS total
    FROM rota.job_wait WHERE job_id = %(job)s
    ORDER BY started_at DESC, name DESC
    LIMIT %(limit)s
) AS last
ORDER BY started_at, name

-- name: job_children
-- A parent's first %(limit)s children with their status (archived ones from
-- the archive), each with how many there are.
SELECT c.name, c.child_id AS id,
       coalesce(j.status, a.status) AS status, coalesce(j.type, a.type) AS type,
       count(*) OVER () AS total
FROM rota.job_child AS c
LEFT JOIN rota.job AS j ON j.id = c.child_id
LEFT JOIN rota.job_archive AS a ON j.id IS NULL AND a.id = c.child_id
WHERE c.parent_id = %(job)s
ORDER BY c.child_id
LIMIT %(limit)s

-- name: job_parent
-- The job that spawned this one, archived or not.
SELECT parent_id FROM rota.job WHERE id = %(job)s
UNION ALL
SELECT parent_id FROM rota.job_archive WHERE id = %(job)s
LIMIT 1

-- name: delete_old_events
-- Events emitted longer ago than the retention, oldest first
-- (job_event_emitted_idx), in capped batches like the archive's moves.
WITH picked AS (
    SELECT key FROM rota.job_event
    WHERE emitted_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s)
    ORDER BY emitted_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM rota.job_event AS e USING picked WHERE e.key = picked.key RETURNING 1
)
SELECT count(*) AS moved FROM deleted
