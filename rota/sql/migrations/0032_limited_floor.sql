-- A claim of a limited type starts its walk of the jobs without a group where
-- the worker's last claim of that type ended, as the walk of unlimited types
-- has since 0.3 (rota.floor.Floor).
--
-- A transaction held open anywhere keeps the ready version of every job
-- claimed since it began, and their entries in job_group_ready_idx with them.
-- rota.pick_limited looked for a due job of the type, and then picked its jobs
-- without a group, each time from the first entry of the range: past every
-- job claimed since the oldest snapshot. Beside a report left open, the claims
-- of a limited type grew slower with every job run (2,900 entries read for a
-- claim of 10 in tests/integration/test_claim_floor.py). With no such
-- transaction the walk is short and this changes little (bench/JOURNAL.md,
-- "The limited claim's starts").
--
-- `since` is a JSON object of the worker's starts: for each limited type, an
-- array of ten run_at values, one per priority (null: from the first). The
-- jobs of named groups are walked as before. The three-argument
-- rota.pick_limited, which claims of 0.3 call, walks from the first entry.

-- Up to `n` due ready jobs of one group of a type (named, or the jobs without
-- a group when `ungrouped`), locked, in claim order: one range of
-- job_group_ready_idx per priority, stopping at the first job not yet due;
-- the jobs without a group from `walk_from` (one run_at per priority, a JSON
-- array; null or missing: from the first).
CREATE FUNCTION rota.ready_of_group(
    job_type text, key text, ungrouped boolean, n integer, at timestamptz, walk_from jsonb
) RETURNS bigint[]
LANGUAGE plpgsql AS $$
BEGIN
    IF ungrouped THEN
        RETURN ARRAY(
            SELECT c.id FROM generate_series(0, 9) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT j.id FROM rota.job AS j
                WHERE j.status = 'ready' AND j.type = job_type AND j.group_key IS NULL
                  AND j.priority = p.priority
                  AND (j.run_at, j.id)
                      >= (coalesce((walk_from ->> p.priority)::timestamptz, '-infinity'), 0)
                  AND j.run_at <= at
                -- group_key first (NULL throughout): the order of
                -- job_group_ready_idx, so that its range is read in order, never
                -- sorted (IS NULL does not make the column a constant of the order)
                ORDER BY j.group_key, j.run_at, j.id
                LIMIT n
                FOR UPDATE SKIP LOCKED
            ) AS c
            LIMIT n);
    END IF;
    RETURN ARRAY(
        SELECT c.id FROM generate_series(0, 9) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT j.id FROM rota.job AS j
            WHERE j.status = 'ready' AND j.type = job_type AND j.group_key = key
              AND j.priority = p.priority AND j.run_at <= at
            ORDER BY j.run_at, j.id
            LIMIT n
            FOR UPDATE SKIP LOCKED
        ) AS c
        LIMIT n);
END
$$;

-- Up to `room` ready jobs of a type, the groups visited in turn from the one
-- after `cursor_key` (NULL: from the first), each group taking at most its
-- room under `group_limit` (NULL: no limit per group) given what runs in it
-- (`running_named` by group, `running_none` without one). Returns the jobs
-- picked (locked) and where the next claim starts. The jobs without a group
-- are walked from `walk_from` (see rota.ready_of_group).
CREATE FUNCTION rota.pick_in_turn(
    job_type text, cursor_key text, room integer, group_limit integer,
    running_named jsonb, running_none integer, at timestamptz, walk_from jsonb,
    OUT picked bigint[], OUT next_cursor text
)
LANGUAGE plpgsql AS $$
DECLARE
    key text := cursor_key;
    next_key text;
    none_visited boolean := false;
    group_room integer;
BEGIN
    picked := '{}';
    LOOP
        IF key IS NULL THEN
            next_key := (SELECT j.group_key FROM rota.job AS j
                         WHERE j.status = 'ready' AND j.type = job_type
                           AND j.group_key IS NOT NULL
                         ORDER BY j.group_key LIMIT 1);
        ELSE
            next_key := (SELECT j.group_key FROM rota.job AS j
                         WHERE j.status = 'ready' AND j.type = job_type
                           AND j.group_key > key
                         ORDER BY j.group_key LIMIT 1);
        END IF;
        IF next_key IS NULL THEN
            -- Past the last named group: the jobs without a group, then around.
            EXIT WHEN none_visited;
            none_visited := true;
            group_room := least(room - cardinality(picked),
                                coalesce(group_limit - running_none, room));
            IF group_room > 0 THEN
                picked := picked || rota.ready_of_group(job_type, NULL, true, group_room, at,
                                                         walk_from);
            END IF;
            key := NULL;
            EXIT WHEN cursor_key IS NULL;  -- started at the first group
        ELSE
            EXIT WHEN none_visited AND next_key > cursor_key;  -- around once
            group_room := least(
                room - cardinality(picked),
                coalesce(group_limit - coalesce((running_named ->> next_key)::integer, 0), room));
            IF group_room > 0 THEN
                picked := picked
                          || rota.ready_of_group(job_type, next_key, false, group_room, at, NULL);
            END IF;
            key := next_key;
        END IF;
        EXIT WHEN cardinality(picked) >= room;
    END LOOP;
    next_cursor := key;
END
$$;

-- The claim's picks of limited types, as 0027 made them, the jobs without a
-- group walked from `since`.
CREATE FUNCTION rota.pick_limited(at timestamptz, types text[], wanted integer, since jsonb)
RETURNS TABLE (id bigint, limit_slot smallint)
LANGUAGE plpgsql AS $$
DECLARE
    lim rota.job_limit;
    room integer;
    recent timestamptz[];
    running_total integer;
    running_named jsonb;
    running_none integer;
    slot_row rota.job_limit_slot;
    s integer;
    n integer;
    pick record;
    picked bigint[];
    labels smallint[];
    cursor_slot integer;
    cursor_key text;
    held boolean;
    visited integer[];
    visited_full boolean[];
    visited_held boolean[];
    k integer;
    in_slot bigint[];
    started timestamptz;
BEGIN
    IF wanted < 1 OR EXISTS (SELECT FROM rota.paused_type WHERE type = '*') THEN
        RETURN;
    END IF;
    FOR lim IN
        SELECT l.* FROM rota.job_limit AS l
        WHERE (types IS NULL OR l.type = ANY(types))
          AND NOT EXISTS (SELECT FROM rota.paused_type AS p WHERE p.type = l.type)
          -- In index order, so that no plan reads the table from its start
          -- (where the jobs run before lie) to find one: a job of a named
          -- group, or one without a group from where the claim starts.
          AND ((SELECT j.id FROM rota.job AS j
                WHERE j.status = 'ready' AND j.type = l.type AND j.group_key IS NOT NULL
                  AND j.run_at <= at
                ORDER BY j.group_key, j.priority, j.run_at, j.id
                LIMIT 1) IS NOT NULL
               OR EXISTS (
                   SELECT FROM generate_series(0, 9) AS p(priority)
                   CROSS JOIN LATERAL (
                       SELECT FROM rota.job AS j
                       WHERE j.status = 'ready' AND j.type = l.type AND j.group_key IS NULL
                         AND j.priority = p.priority
                         AND (j.run_at, j.id)
                             >= (coalesce((since -> l.type ->> p.priority)::timestamptz,
                                          '-infinity'), 0)
                         AND j.run_at <= at
                       ORDER BY j.group_key, j.run_at, j.id  -- see rota.ready_of_group
                       LIMIT 1) AS f))
        ORDER BY l.type
    LOOP
        EXIT WHEN wanted < 1;

        -- The path of slots: a concurrency alone, settled. The free slots are
        -- locked in turn, from one that depends on the session so that claims
        -- side by side start at different slots, until their room covers what
        -- is wanted; then one pick for them all, each job labelled with a slot
        -- that has room for it (a pick per slot would pick the same jobs
        -- again: they are still ready, locked by this very transaction).
        IF lim.slots_settled AND lim.concurrency IS NOT NULL
           AND lim.group_concurrency IS NULL AND lim.rate IS NULL THEN
            labels := '{}';
            cursor_slot := NULL;
            visited := '{}';
            visited_full := '{}';
            visited_held := '{}';
            FOR s IN
                SELECT (g + pg_backend_pid()) % rota.limit_slots()
                FROM generate_series(0, rota.limit_slots() - 1) AS g
            LOOP
                EXIT WHEN cardinality(labels) >= wanted;
                CONTINUE WHEN rota.limit_share(lim.concurrency, s) < 1;
                SELECT * INTO slot_row FROM rota.job_limit_slot AS ls
                WHERE ls.type = lim.type AND ls.slot = s
                FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
                n := (SELECT count(*) FROM rota.job AS j
                      WHERE j.status = 'running' AND j.type = lim.type AND j.limit_slot = s);
                room := least(wanted - cardinality(labels),
                              rota.limit_share(lim.concurrency, s) - n);
                visited := visited || s;
                visited_full := visited_full || (room < wanted - cardinality(labels));
                visited_held := visited_held || slot_row.held_back;
                CONTINUE WHEN room < 1;
                IF cursor_slot IS NULL THEN
                    cursor_slot := s;
                    cursor_key := slot_row.group_cursor;
                END IF;
                labels := labels || array_fill(s::smallint, ARRAY[room]);
            END LOOP;
            -- Held back: the slots it locked had less room than it wanted. Those
            -- that were full are marked, the others cleared (on change only).
            held := cardinality(labels) < wanted;
            FOR k IN 1 .. cardinality(visited) LOOP
                IF (held AND visited_full[k]) IS DISTINCT FROM visited_held[k] THEN
                    UPDATE rota.job_limit_slot AS ls SET held_back = (held AND visited_full[k])
                    WHERE ls.type = lim.type AND ls.slot = visited[k];
                END IF;
            END LOOP;
            CONTINUE WHEN cardinality(labels) = 0;
            SELECT * INTO pick FROM rota.pick_in_turn(lim.type, cursor_key,
                                                      cardinality(labels), NULL, '{}', 0, at,
                                                      since -> lim.type);
            CONTINUE WHEN cardinality(pick.picked) = 0;
            IF pick.next_cursor IS DISTINCT FROM cursor_key THEN
                UPDATE rota.job_limit_slot AS ls SET group_cursor = pick.next_cursor
                WHERE ls.type = lim.type AND ls.slot = cursor_slot;
            END IF;
            RETURN QUERY
            SELECT p.id, labels[p.n] FROM unnest(pick.picked) WITH ORDINALITY AS p(id, n);
            wanted := wanted - cardinality(pick.picked);
            CONTINUE;
        END IF;

        -- The path of one row: the limit row and every slot locked (waiting
        -- for the claims of the slots to commit), then every running job counted.
        SELECT l.* INTO lim FROM rota.job_limit AS l WHERE l.type = lim.type FOR UPDATE;
        CONTINUE WHEN NOT FOUND;  -- cleared meanwhile: the unlimited claim takes them
        PERFORM FROM rota.job_limit_slot AS ls WHERE ls.type = lim.type
        ORDER BY ls.slot FOR UPDATE;
        IF NOT lim.slots_settled THEN
            PERFORM rota.settle_slots(lim.type);  -- for the claims after this one
        END IF;
        room := wanted;
        recent := '{}';
        -- Now, with the limit held: the claim's own instant moved on by the time
        -- this transaction has taken so far (in production, the clock now; a
        -- test's frozen instant stays frozen but for that).
        started := at + (clock_timestamp() - now());
        IF lim.rate IS NOT NULL THEN
            recent := ARRAY(SELECT x FROM unnest(lim.starts) AS x
                            WHERE x > started - make_interval(secs => lim.per_seconds) ORDER BY x);
            room := least(room, lim.rate - cardinality(recent));
        END IF;
        running_named := '{}';
        running_none := 0;
        in_slot := '{}';
        IF lim.concurrency IS NOT NULL OR lim.group_concurrency IS NOT NULL THEN
            -- One count of the running jobs, by group and by slot.
            WITH c AS MATERIALIZED (SELECT * FROM rota.running_of_type(lim.type)),
            r AS (SELECT c.group_key AS g, sum(c.n) AS n FROM c GROUP BY c.group_key)
            SELECT (SELECT coalesce(sum(r.n), 0) FROM r),
                   (SELECT coalesce(jsonb_object_agg(r.g, r.n) FILTER (WHERE r.g IS NOT NULL),
                                    '{}') FROM r),
                   (SELECT coalesce(sum(r.n) FILTER (WHERE r.g IS NULL), 0) FROM r),
                   ARRAY(SELECT (SELECT coalesce(sum(c.n), 0) FROM c WHERE c.limit_slot = g)
                         FROM generate_series(0, rota.limit_slots() - 1) AS g ORDER BY g)
            INTO running_total, running_named, running_none, in_slot;
            IF lim.concurrency IS NOT NULL THEN
                room := least(room, lim.concurrency - running_total);
            END IF;
        END IF;
        IF room < 1 THEN
            IF NOT lim.held_back THEN
                UPDATE rota.job_limit AS l SET held_back = true WHERE l.type = lim.type;
            END IF;
            CONTINUE;
        END IF;

        SELECT * INTO pick FROM rota.pick_in_turn(lim.type, lim.group_cursor, room,
                                                  lim.group_concurrency, running_named,
                                                  running_none, at, since -> lim.type);
        picked := pick.picked;
        -- Fewer than wanted: held back by the limit, or fewer were ready.
        held := cardinality(picked) < wanted;
        IF cardinality(picked) = 0 THEN
            IF held IS DISTINCT FROM lim.held_back THEN
                UPDATE rota.job_limit AS l SET held_back = held WHERE l.type = lim.type;
            END IF;
            CONTINUE;
        END IF;
        UPDATE rota.job_limit AS l
        SET group_cursor = pick.next_cursor,
            starts = CASE WHEN l.rate IS NULL THEN '{}'::timestamptz[]
                          ELSE recent || array_fill(started, ARRAY[cardinality(picked)]) END,
            held_back = held
        WHERE l.type = lim.type;
        -- Each job goes to a slot with room under its share, so that the slots
        -- fit again once the jobs running without one have ended. There is
        -- room enough: the shares add up to the concurrency, and the room was
        -- the concurrency less every running job.
        labels := '{}';
        IF lim.concurrency IS NOT NULL THEN
            FOR s IN 0 .. rota.limit_slots() - 1 LOOP
                EXIT WHEN cardinality(labels) >= cardinality(picked);
                n := least(rota.limit_share(lim.concurrency, s) - in_slot[s + 1],
                           cardinality(picked) - cardinality(labels));
                IF n > 0 THEN
                    labels := labels || array_fill(s::smallint, ARRAY[n]);
                END IF;
            END LOOP;
        END IF;
        RETURN QUERY
        SELECT p.id, labels[p.n]::smallint FROM unnest(picked) WITH ORDINALITY AS p(id, n);
        wanted := wanted - cardinality(picked);
    END LOOP;
END
$$;

-- The claims of 0.3: from the first entry, as before.
CREATE OR REPLACE FUNCTION rota.pick_limited(at timestamptz, types text[], wanted integer)
RETURNS TABLE (id bigint, limit_slot smallint)
LANGUAGE sql AS $$
    SELECT * FROM rota.pick_limited(at, types, wanted, NULL::jsonb)
$$;

DROP FUNCTION rota.pick_in_turn(text, text, integer, integer, jsonb, integer, timestamptz);
DROP FUNCTION rota.ready_of_group(text, text, boolean, integer, timestamptz);
