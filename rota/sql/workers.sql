-- Workers registered in rota.worker (see migration 0005), and the minute
-- samples of the queue that the console charts.

-- name: worker_register
INSERT INTO rota.worker (id, host, pid, concurrency, types, started_at, seen_at, expires_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(concurrency)s, %(types)s::text[],
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl)s))
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, concurrency = excluded.concurrency,
    types = excluded.types, started_at = excluded.started_at, seen_at = excluded.seen_at,
    expires_at = excluded.expires_at

-- name: worker_refresh
-- A heartbeat: push the row's expiry forward. A row that expired and was
-- deleted meanwhile (the worker was stalled for long) comes back.
INSERT INTO rota.worker (id, host, pid, concurrency, types, started_at, seen_at, expires_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(concurrency)s, %(types)s::text[],
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl)s))
ON CONFLICT (id) DO UPDATE
SET seen_at = excluded.seen_at, expires_at = excluded.expires_at

-- name: worker_deregister
DELETE FROM rota.worker WHERE id = %(id)s RETURNING id

-- name: worker_expire
-- Rows of workers that stopped refreshing (killed, or cut off): gone.
DELETE FROM rota.worker
WHERE expires_at < coalesce(%(now)s::timestamptz, now())
RETURNING id

-- name: worker_list
-- Live workers (unexpired rows whose presence lock is held, as worker_live_count), each with what it runs now: how many running rows it holds
-- (by locked_by) and the first few of them.
SELECT w.id, w.host, w.pid, w.concurrency, w.types, w.started_at, w.seen_at, w.expires_at,
       coalesce(r.jobs, '[]'::jsonb) AS jobs, coalesce(n.running, 0) AS running
FROM rota.worker AS w
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object('id', f.id, 'type', f.type, 'attempts', f.attempts,
                                        'started_at', f.started_at,
                                        'locked_until', f.locked_until)
                     ORDER BY f.id) AS jobs
    FROM (SELECT id, type, attempts, started_at, locked_until
          FROM rota.job AS j
          WHERE j.status = 'running' AND j.locked_by = w.id
          ORDER BY j.id
          LIMIT %(shown)s) AS f
) AS r ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS running
    FROM rota.job AS j
    WHERE j.status = 'running' AND j.locked_by = w.id
) AS n ON true
WHERE w.expires_at >= coalesce(%(now)s::timestamptz, now())
  AND EXISTS (
      SELECT 1 FROM pg_locks AS l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
        AND l.classid = 1383036001::oid AND l.objid = hashtext(w.id)::oid
  )
ORDER BY w.started_at, w.id

-- name: worker_presence_hold
-- A session advisory lock (key 1383036001 = "Rota", hashtext(id)) held by the
-- connection that keeps the worker's row: PostgreSQL lets go of it the moment
-- that connection ends, so a killed worker stops counting as alive at once,
-- not when its row expires. Taken only when not held yet (locks stack), and
-- never waited for: behind a pooler in transaction mode the refresh may reach
-- another server connection than the one holding it, and would wait for ever.
SELECT pg_try_advisory_lock(1383036001, hashtext(%(id)s))
WHERE NOT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 2
      AND classid = 1383036001::oid AND objid = hashtext(%(id)s)::oid
)

-- name: worker_loads
-- Live workers claiming any of the given types (all workers when none given),
-- with the running jobs each holds, found among the running rows only.
SELECT w.id, w.host, w.concurrency,
       (SELECT count(*) FROM rota.job AS j
        WHERE j.status = 'running' AND j.locked_by = w.id) AS running
FROM rota.worker AS w
WHERE w.expires_at >= coalesce(%(now)s::timestamptz, now())
  AND (%(types)s::text[] IS NULL OR w.types && %(types)s::text[])
ORDER BY w.id

-- name: worker_live_count
-- Workers alive: an unexpired row whose worker still holds its presence lock.
SELECT count(*) AS workers
FROM rota.worker AS w
WHERE w.expires_at >= coalesce(%(now)s::timestamptz, now())
  AND EXISTS (
      SELECT 1 FROM pg_locks AS l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
        AND l.classid = 1383036001::oid AND l.objid = hashtext(w.id)::oid
  )

-- name: queue_sample_record
-- The queue as it is this minute, unless the minute has its sample already.
-- The totals come from the trigger-kept done counts and the partial indexes
-- of ready, running and ended rows, never from every row of rota.job.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           date_trunc('minute', coalesce(%(now)s::timestamptz, now())) AS minute
)
INSERT INTO rota.queue_sample (minute, done_total, ended_total, ready_due, running,
                               oldest_ready_age_seconds)
SELECT c.minute,
       (SELECT least(coalesce(sum(count), 0), 9223372036854775807)::bigint
        FROM rota.job_done_count),
       (SELECT count(*) FROM rota.job WHERE status IN ('failed', 'dead', 'cancelled')),
       (SELECT count(*) FROM rota.job WHERE status = 'ready' AND run_at <= c.now),
       (SELECT count(*) FROM rota.job WHERE status = 'running'),
       coalesce((SELECT extract(epoch FROM c.now - min(run_at))
                 FROM rota.job WHERE status = 'ready' AND run_at <= c.now), 0)
FROM clock AS c
WHERE NOT EXISTS (SELECT FROM rota.queue_sample AS s WHERE s.minute = c.minute)
ON CONFLICT (minute) DO NOTHING
RETURNING minute

-- name: queue_sample_prune
-- Eight days of samples: the console's charts show up to seven.
WITH per_type AS (
    DELETE FROM rota.queue_sample_type
    WHERE minute < coalesce(%(now)s::timestamptz, now()) - interval '8 days'
)
DELETE FROM rota.queue_sample
WHERE minute < coalesce(%(now)s::timestamptz, now()) - interval '8 days'

-- name: done_counts_fold
-- One row per type in rota.job_done_count (see migration 0016).
SELECT rota.fold_done_counts() AS folded

-- name: queue_sample_type_record
-- This minute's sample per job type (after queue_sample_record wrote the
-- minute's queue sample): the same counters and partial indexes, by type.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           date_trunc('minute', coalesce(%(now)s::timestamptz, now())) AS minute
),
done AS (
    SELECT type, least(sum(count), 9223372036854775807)::bigint AS n
    FROM rota.job_done_count GROUP BY type
),
ended AS (
    SELECT type, count(*) AS n FROM rota.job
    WHERE status IN ('failed', 'dead', 'cancelled') GROUP BY type
),
due AS (
    SELECT type, count(*) AS n, min(run_at) AS oldest FROM rota.job, clock AS c
    WHERE status = 'ready' AND run_at <= c.now GROUP BY type
),
running AS (SELECT type, count(*) AS n FROM rota.job WHERE status = 'running' GROUP BY type),
types AS (
    SELECT type FROM done UNION SELECT type FROM ended
    UNION SELECT type FROM due UNION SELECT type FROM running
)
INSERT INTO rota.queue_sample_type (minute, type, done_total, ended_total, ready_due, running,
                                    oldest_ready_age_seconds)
SELECT c.minute, t.type, coalesce(d.n, 0), coalesce(e.n, 0), coalesce(u.n, 0), coalesce(r.n, 0),
       coalesce(extract(epoch FROM c.now - u.oldest), 0)
FROM clock AS c
CROSS JOIN types AS t
LEFT JOIN done AS d ON d.type = t.type
LEFT JOIN ended AS e ON e.type = t.type
LEFT JOIN due AS u ON u.type = t.type
LEFT JOIN running AS r ON r.type = t.type
ON CONFLICT (minute, type) DO NOTHING

-- name: queue_samples
-- The samples of the last `minutes` minutes, oldest first, with the one before
-- them so the first minute's throughput can be told.
SELECT minute, done_total, ended_total, ready_due, running, oldest_ready_age_seconds
FROM rota.queue_sample
WHERE minute >= date_trunc('minute', coalesce(%(now)s::timestamptz, now()))
                - make_interval(mins => %(minutes)s)
ORDER BY minute

-- name: failure_counts_fold
-- The last hour's failed attempts in one row per minute and type, and none
-- older than the charts show (migration 0028).
SELECT rota.fold_failure_counts(
           date_trunc('minute', coalesce(%(now)s::timestamptz, now())),
           coalesce(%(now)s::timestamptz, now()) - interval '8 days') AS folded
