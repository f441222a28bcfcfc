-- Limits per job type (rota.job_limit, migration 0013): set, cleared, and
-- what they hold back. The claim reads them in rota.pick_limited.

-- name: limit_set
-- Set a type's limits, replacing any it had; the starts counted for a rate
-- and the group cursor stay. Idle workers wake: a looser limit may free jobs.
WITH saved AS (
    INSERT INTO rota.job_limit AS l (type, concurrency, group_concurrency, rate, per_seconds,
                                     updated_at)
    VALUES (%(type)s, %(concurrency)s, %(group_concurrency)s, %(rate)s, %(per)s,
            coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (type) DO UPDATE
    SET concurrency = excluded.concurrency,
        group_concurrency = excluded.group_concurrency,
        rate = excluded.rate,
        per_seconds = excluded.per_seconds,
        starts = CASE WHEN excluded.rate IS NULL THEN '{}' ELSE l.starts END,
        updated_at = excluded.updated_at
    RETURNING type
),
woken AS (
    SELECT pg_notify('rota_jobs', '')
)
SELECT type FROM saved LEFT JOIN woken ON true

-- name: limit_settle
-- A limit just committed, settled when it can be (rota.settle_limit,
-- migration 0020): the claims after it then take its slots.
SELECT rota.settle_limit(%(type)s) AS settled

-- name: limit_clear
WITH cleared AS (
    DELETE FROM rota.job_limit WHERE type = %(type)s RETURNING type
),
woken AS (
    SELECT pg_notify('rota_jobs', '') FROM cleared
)
SELECT type FROM cleared LEFT JOIN woken ON true

-- name: limit_states
-- Every limit with what it holds back now: due jobs of the type that no claim
-- may take at this instant (the concurrency, the rate or the groups' room is
-- used up). Reads the type's due jobs (job_group_ready_idx) and its running
-- ones (job_running_idx), grouped by group; never the done rows.
SELECT l.type, l.concurrency, l.group_concurrency, l.rate, l.per_seconds,
       t.due, t.running, w.starts AS recent_starts,
       t.due - least(t.due,
                     greatest(coalesce(l.concurrency - t.running, t.due), 0),
                     greatest(coalesce(l.rate - w.starts, t.due), 0),
                     t.group_room) AS held
FROM rota.job_limit AS l
CROSS JOIN LATERAL (
    SELECT coalesce(sum(g.due), 0)::bigint AS due,
           coalesce(sum(g.running), 0)::bigint AS running,
           coalesce(sum(least(g.due, greatest(coalesce(l.group_concurrency - g.running, g.due),
                                              0))), 0)::bigint AS group_room
    FROM (SELECT sum(u.due) AS due, sum(u.running) AS running
          FROM (SELECT group_key, count(*) AS due, 0 AS running
                FROM rota.job
                WHERE type = l.type AND status = 'ready'
                  AND run_at <= coalesce(%(now)s::timestamptz, now())
                GROUP BY group_key
                UNION ALL
                SELECT group_key, 0, count(*)
                FROM rota.job
                WHERE type = l.type AND status = 'running'
                GROUP BY group_key) AS u
          GROUP BY u.group_key) AS g
) AS t
CROSS JOIN LATERAL (
    SELECT count(*) AS starts FROM unnest(l.starts) AS s
    WHERE s > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => l.per_seconds)
) AS w
ORDER BY l.type
