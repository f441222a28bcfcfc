-- The walks of a limited type's ready jobs are planned with sorting off, so
-- that they read job_group_ready_idx in order whatever the statistics say.
--
-- The jobs without a group are one range of job_group_ready_idx per priority,
-- and each walk asks for that range's order (rota.ready_of_group, the limit
-- loop's test that a job is ready, the floor probe's first job). The claim
-- index (priority, run_at, id) can answer the same query if its rows are
-- sorted after. Planned from statistics taken while nothing was ready (a
-- table of finished jobs, the history Rota keeps), both plans are costed for
-- one row, and with a type's name as long as the names of domains and verbs
-- make it, the group index's wider entries tipped the choice to the sort:
-- every ready job of the priority read and sorted for each claim, 60,000
-- index rows for a claim of 100 behind a backlog of 20,000, 16 ms instead of
-- a fraction of one (tests/integration/test_limit_plans.py).
--
-- With enable_sort off for the function, an ordered index walk always wins
-- where one exists. Every plan made inside rota.pick_limited is made under it
-- (the functions it calls, rota.pick_in_turn and rota.ready_of_group, plan
-- their statements there); what must sort still sorts, and an aggregate
-- hashes. A later CREATE OR REPLACE of the function drops the setting unless
-- it says SET enable_sort = off again (the tests above fail without it).
ALTER FUNCTION rota.pick_limited(timestamptz, text[], integer, jsonb) SET enable_sort = off;

-- The first due ready job without a group of each priority of each limited
-- type, for rota.floor.Floor's probe (the named statement limited_floor).
CREATE FUNCTION rota.limited_floor(at timestamptz, types text[])
RETURNS TABLE (type text, priority integer, run_at timestamptz)
LANGUAGE sql STABLE SET enable_sort = off AS $$
    SELECT l.type, p.priority, f.run_at
    FROM rota.job_limit AS l
    CROSS JOIN generate_series(0, 9) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT j.run_at
        FROM rota.job AS j
        WHERE j.status = 'ready'
          AND j.type = l.type
          AND j.group_key IS NULL
          AND j.priority = p.priority
          AND j.run_at <= limited_floor.at
        ORDER BY j.group_key, j.run_at, j.id  -- job_group_ready_idx's order
        LIMIT 1
    ) AS f
    WHERE (limited_floor.types IS NULL OR l.type = ANY(limited_floor.types))
      AND NOT EXISTS (SELECT FROM rota.paused_type AS t WHERE t.type IN (l.type, '*'))
$$;
