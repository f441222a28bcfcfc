-- Queries behind rota.metrics and `rota status`. Each one must stay cheap on a
-- table of millions of done rows: they read the partial indexes of the few
-- ready, running, failed and dead rows, and small side tables, never every row
-- of rota.job (tests/integration/test_metrics.py checks the plans).

-- name: metrics_job_counts
-- One row per (status, type): the number of jobs, and for ready jobs the number
-- due (run_at <= now) and the age in seconds of the oldest due one (0 if none).
-- Done counts come from the trigger-kept rota.job_done_count.
SELECT 'ready' AS status, type, count(*) AS jobs,
       count(*) FILTER (WHERE run_at <= coalesce(%(now)s::timestamptz, now())) AS due,
       coalesce(extract(epoch FROM coalesce(%(now)s::timestamptz, now())
                                   - min(run_at) FILTER (
                                         WHERE run_at <= coalesce(%(now)s::timestamptz, now()))),
                0)::float8 AS oldest_ready_age_seconds
FROM rota.job
WHERE status = 'ready'
GROUP BY type
UNION ALL
SELECT 'running', type, count(*), 0, 0
FROM rota.job
WHERE status = 'running'
GROUP BY type
UNION ALL
-- Waiting jobs (durable jobs' sleeps and waits) count apart: neither ready nor
-- running, read from their own partial index (job_waiting_idx).
SELECT 'waiting', type, count(*), 0, 0
FROM rota.job
WHERE status = 'waiting'
GROUP BY type
UNION ALL
SELECT status, type, count(*), 0, 0
FROM rota.job
WHERE status IN ('failed', 'dead', 'cancelled')
GROUP BY status, type
UNION ALL
-- A sum of bigint shards may pass a bigint either way (rows written around
-- the triggers): it reads as the nearest count a bigint holds, never below 0.
SELECT 'done', type, greatest(least(sum(count), 9223372036854775807), 0)::bigint, 0, 0
FROM rota.job_done_count
GROUP BY type
HAVING sum(count) <> 0

-- name: metrics_lease_expirations
-- Lease expirations counted by the reaper per UTC hour: the total ever, the
-- current hour so far, the whole previous hour, and the last 24 hours.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           date_trunc('hour', coalesce(%(now)s::timestamptz, now()), 'UTC') AS hour
)
-- An hour's count below 0 (a row written around Rota) counts as none, and a
-- sum past a bigint reads as the largest.
SELECT c.now,
       least(coalesce(sum(e.count), 0), 9223372036854775807)::bigint AS total,
       least(coalesce(sum(e.count) FILTER (WHERE e.hour = c.hour), 0),
             9223372036854775807)::bigint AS current_hour,
       least(coalesce(sum(e.count) FILTER (WHERE e.hour = c.hour - interval '1 hour'), 0),
             9223372036854775807)::bigint AS previous_hour,
       least(coalesce(sum(e.count) FILTER (WHERE e.hour > c.now - interval '24 hours'
                                             AND e.hour <= c.now), 0),
             9223372036854775807)::bigint AS last_24h
FROM clock AS c
LEFT JOIN (SELECT hour, greatest(count, 0) AS count
           FROM rota.lease_expiration) AS e ON true
GROUP BY c.now, c.hour

-- name: metrics_lease_expirations_by_hour
-- The hourly buckets of the last 24 hours that saw an expiration, oldest first.
SELECT hour, greatest(count, 0) AS count
FROM rota.lease_expiration
WHERE hour > coalesce(%(now)s::timestamptz, now()) - interval '24 hours'
  AND hour <= coalesce(%(now)s::timestamptz, now())
ORDER BY hour

-- name: metrics_schedules
-- Slots every schedule missed (all schedulers down) or skipped (Forbid policy);
-- a count below 0 (a row written around Rota) reads as none.
SELECT name, job_type, suspend, greatest(missed_slots, 0) AS missed_slots,
       greatest(skipped_slots, 0) AS skipped_slots, next_run_at
FROM rota.schedule
ORDER BY name

-- name: metrics_dead_totals
-- Jobs that ever went dead, per type (migration 0010's trigger-kept counts).
SELECT type, greatest(least(sum(count), 9223372036854775807), 0)::bigint AS total
FROM rota.job_dead_count
GROUP BY type
ORDER BY type

-- name: metrics_exporter_lead
-- One process per database serves the queue-wide measures: the one whose
-- metrics connection holds this session lock (key 1383036001 = "Rota", 0).
-- It is released when that connection ends, and the next scrape of another
-- exporter takes it.
SELECT CASE
           WHEN EXISTS (SELECT 1 FROM pg_locks
                        WHERE locktype = 'advisory' AND pid = pg_backend_pid()
                          AND classid = 1383036001::oid AND objid = 0::oid AND objsubid = 2)
           THEN true  -- held already (session locks stack: do not take it twice)
           ELSE pg_try_advisory_lock(1383036001, 0)
       END AS leader
