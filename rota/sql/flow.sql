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
-- Every limit (of the given types, or all) with what it holds back now: due
-- jobs of the type that no claim may take at this instant (the concurrency,
-- the rate or the groups' room is used up). Reads each type's due jobs
-- (job_group_ready_idx) and the running jobs once, in one walk of
-- job_running_idx counted by type and group and joined to the limits: no index
-- finds a type's running jobs (a per-type probe scanned every running row once
-- per limit, 3-5 s with 1,000 limits beside 30,000 running jobs); never the
-- done rows.
WITH lim AS MATERIALIZED (
    SELECT l.* FROM rota.job_limit AS l
    WHERE %(types)s::text[] IS NULL OR l.type = ANY(%(types)s::text[])
),
running AS MATERIALIZED (
    SELECT j.type, j.group_key, count(*) AS running
    FROM rota.job AS j
    WHERE j.status = 'running'
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
    GROUP BY j.type, j.group_key
),
due AS MATERIALIZED (
    SELECT l.type, d.group_key, d.due
    FROM lim AS l
    CROSS JOIN LATERAL (
        SELECT j.group_key, count(*) AS due
        FROM rota.job AS j
        WHERE j.type = l.type AND j.status = 'ready'
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
        GROUP BY j.group_key
    ) AS d
),
by_group AS (
    SELECT u.type, sum(u.due) AS due, sum(u.running) AS running
    FROM (SELECT type, group_key, due, 0 AS running FROM due
          UNION ALL
          SELECT type, group_key, 0, running FROM running) AS u
    GROUP BY u.type, u.group_key
),
by_type AS (
    SELECT g.type, sum(g.due)::bigint AS due, sum(g.running)::bigint AS running,
           sum(least(g.due, greatest(coalesce(l.group_concurrency - g.running, g.due),
                                     0)))::bigint AS group_room
    FROM by_group AS g JOIN lim AS l ON l.type = g.type
    GROUP BY g.type
)
SELECT l.type, l.concurrency, l.group_concurrency, l.rate, l.per_seconds,
       coalesce(t.due, 0) AS due, coalesce(t.running, 0) AS running, w.starts AS recent_starts,
       coalesce(t.due - least(t.due,
                              greatest(coalesce(l.concurrency - t.running, t.due), 0),
                              greatest(coalesce(l.rate - w.starts, t.due), 0),
                              t.group_room), 0) AS held
FROM lim AS l
LEFT JOIN by_type AS t ON t.type = l.type
CROSS JOIN LATERAL (
    SELECT count(*) AS starts FROM unnest(l.starts) AS s
    WHERE s > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => l.per_seconds)
) AS w
ORDER BY l.type
