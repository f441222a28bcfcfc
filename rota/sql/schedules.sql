-- Recurring schedules: their rows, and turning due slots into jobs. Times
-- compare against coalesce(%(now)s, now()) so tests can freeze the clock.

-- name: database_now
SELECT coalesce(%(now)s::timestamptz, now()) AS now

-- name: schedule_lock_by_name
SELECT * FROM rota.schedule WHERE name = %(name)s FOR UPDATE

-- name: schedule_insert
INSERT INTO rota.schedule (name, job_type, cron, timezone, payload, next_run_at, suspend,
                           spread_seconds, concurrency_policy, starting_deadline_seconds,
                           max_attempts, priority, timeout_seconds, group_key,
                           unique_for_seconds, unique_active, created_at, updated_at)
VALUES (%(name)s, %(job_type)s, %(cron)s, %(timezone)s, %(payload)s, %(next_run_at)s,
        %(suspend)s, %(spread_seconds)s, %(concurrency_policy)s, %(starting_deadline_seconds)s,
        %(max_attempts)s, %(priority)s, %(timeout_seconds)s, %(group)s,
        %(unique_for_seconds)s, %(unique_active)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO NOTHING
RETURNING *

-- name: schedule_update
UPDATE rota.schedule
SET job_type = %(job_type)s, cron = %(cron)s, timezone = %(timezone)s, payload = %(payload)s,
    next_run_at = %(next_run_at)s, suspend = %(suspend)s, spread_seconds = %(spread_seconds)s,
    concurrency_policy = %(concurrency_policy)s,
    starting_deadline_seconds = %(starting_deadline_seconds)s,
    max_attempts = %(max_attempts)s, priority = %(priority)s,
    timeout_seconds = %(timeout_seconds)s, group_key = %(group)s,
    unique_for_seconds = %(unique_for_seconds)s, unique_active = %(unique_active)s,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s
RETURNING *

-- name: schedule_delete
DELETE FROM rota.schedule WHERE name = %(name)s RETURNING id

-- name: schedule_get
SELECT * FROM rota.schedule WHERE name = %(name)s

-- name: schedule_list
SELECT * FROM rota.schedule ORDER BY name

-- name: schedule_notify
-- Wakes sleeping schedulers (delivered when the transaction commits).
SELECT pg_notify('rota_schedule', %(name)s)

-- name: schedule_next_due
-- Locks one due schedule; SKIP LOCKED lets other schedulers take the others.
-- A row another scheduler has just advanced no longer passes the WHERE clause
-- when it is re-checked under the lock, so a slot is never handled twice.
SELECT s.*, coalesce(%(now)s::timestamptz, now()) AS tick
FROM rota.schedule AS s
WHERE NOT s.suspend AND s.next_run_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY s.next_run_at
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: schedule_previous_job_active
-- Forbid: is the schedule's most recent job still waiting or running?
SELECT coalesce(bool_or(status IN ('ready', 'running', 'waiting')), false) AS active
FROM (SELECT status FROM rota.job WHERE schedule_id = %(schedule_id)s
      ORDER BY slot DESC LIMIT 1) AS latest

-- name: schedule_enqueue_slot
-- The idempotency key makes a slot one job, whoever enqueues it how often.
-- With the schedule's unique_active, the job also holds the schedule's key
-- ('schedule:<id>') in job_unique_active_idx: ON CONFLICT names no index, so
-- a ready or running job of an earlier slot refuses it too (no row; the
-- scheduler tells the two apart with schedule_slot_enqueued).
INSERT INTO rota.job (type, payload, idempotency_key, unique_key, unique_active, run_at,
                      max_attempts, priority, timeout_seconds, schedule_id, slot, group_key,
                      created_at)
VALUES (%(type)s, %(payload)s, %(key)s, %(unique_key)s, %(unique_active)s, %(run_at)s,
        %(max_attempts)s, %(priority)s, %(timeout_seconds)s, %(schedule_id)s, %(slot)s,
        %(group)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT DO NOTHING
RETURNING id

-- name: schedule_enqueue_slot_unique_for
-- A slot of a schedule with unique_for_seconds: it takes the schedule's key
-- in rota.job_unique_key only once the window opened by the slot of the key's
-- last job has passed, the window measured between slots (not from when a
-- scheduler got to them), so a late tick judges a slot as a punctual one
-- would. A slot that already has its job takes nothing. No row: the slot is
-- inside the window, or already enqueued.
WITH held AS (
    INSERT INTO rota.job_unique_key (key, job_id, until)
    SELECT %(unique_key)s, nextval(pg_get_serial_sequence('rota.job', 'id')),
           %(slot)s::timestamptz + make_interval(secs => %(unique_for)s)
    WHERE NOT EXISTS (SELECT FROM rota.job WHERE idempotency_key = %(key)s)
    ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, until = excluded.until
        WHERE rota.job_unique_key.until <= %(slot)s::timestamptz
    RETURNING job_id
)
INSERT INTO rota.job (id, type, payload, idempotency_key, unique_key, run_at, max_attempts,
                      priority, timeout_seconds, schedule_id, slot, group_key, created_at)
OVERRIDING SYSTEM VALUE
SELECT held.job_id, %(type)s, %(payload)s, %(key)s, %(unique_key)s, %(run_at)s,
       %(max_attempts)s, %(priority)s, %(timeout_seconds)s, %(schedule_id)s, %(slot)s,
       %(group)s, coalesce(%(now)s::timestamptz, now())
FROM held
RETURNING id

-- name: schedule_slot_enqueued
SELECT EXISTS (SELECT FROM rota.job WHERE idempotency_key = %(key)s) AS enqueued

-- name: schedule_advance
UPDATE rota.schedule
SET next_run_at = %(next_run_at)s,
    last_slot = coalesce(%(last_slot)s, last_slot),
    missed_slots = missed_slots + %(missed)s,
    skipped_slots = skipped_slots + %(skipped)s
WHERE id = %(id)s

-- name: schedule_earliest_due
-- How long a scheduler may sleep before the next slot comes due.
SELECT min(next_run_at) - coalesce(%(now)s::timestamptz, now()) AS wait
FROM rota.schedule
WHERE NOT suspend

-- name: schedule_listen
LISTEN rota_schedule
