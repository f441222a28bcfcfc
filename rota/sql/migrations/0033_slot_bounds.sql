-- A slot knows an upper bound of the jobs running in it, so that a claim of a
-- limit that does not bind no longer counts them.
--
-- A claim on slots counted the running jobs of each slot it locked: an index
-- scan of job_limit_slot_idx that visits the heap for every entry (the
-- index's pages are never all-visible), 1.0-1.8 us a job of the claim with
-- 500 jobs running (bench/JOURNAL.md, "The limited path's price, part by
-- part"), and, beside a transaction held open anywhere, every version of
-- every job run in the slot since it began (6.8 ms a claim after 30,000 jobs,
-- tests/integration/test_claim_floor.py).
--
-- Only a claim starts a job in a slot, and only while it holds the slot's
-- lock (the slot path locks the slots it labels into; the path of one row
-- locks every slot of the type). Outcomes, the reaper and job control only
-- take jobs out of running. So the claim that holds a slot can leave behind
-- it what ran there plus what it started: no more can run there until the
-- next claim of the slot. running_at_most is that bound (NULL: unknown). The
-- next claim of the slot takes it for the running count while the share
-- less the bound leaves room for all the claim still wants: the room it
-- gives is then the same as an exact count would give. Otherwise, and with
-- no bound, the claim counts, as before, and the bound is exact again. A
-- limit that binds counts on every claim; one that does not counts about
-- once per share's worth of jobs started in the slot.
--
-- The path of one row labels jobs with slots by its own count of every
-- running job, and forgets the slots' bounds. A job made running in a slot by
-- any other statement (rota.job written by hand: an UPDATE or an INSERT)
-- makes its slot forget its bound, by a trigger, so that the slot's next
-- claim counts it. The claim marks its own transaction (rota.claiming), which
-- the trigger's WHEN clause reads: the jobs a claim starts call no function.

ALTER TABLE rota.job_limit_slot ADD COLUMN running_at_most integer;

-- The claim's picks of limited types, as 0032 made them, each slot's running
-- jobs taken from its bound while the bound leaves room.
CREATE OR REPLACE FUNCTION rota.pick_limited(at timestamptz, types text[], wanted integer, since jsonb)
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
    visited_bound integer[];
    visited_at_most integer[];
    visited_room integer[];
    labelled integer;
    k integer;
    in_slot bigint[];
    started timestamptz;
BEGIN
    IF wanted < 1 OR EXISTS (SELECT FROM rota.paused_type WHERE type = '*') THEN
        RETURN;
    END IF;
    -- The jobs this claim starts in slots are in the slots' bounds: the
    -- trigger job_slot_bound_update lets them be.
    PERFORM set_config('rota.claiming', 'on', true);
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
            visited_bound := '{}';
            visited_at_most := '{}';
            visited_room := '{}';
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
                -- What runs in the slot: at most its bound, while that leaves
                -- room for all that is still wanted; else counted.
                IF rota.limit_share(lim.concurrency, s) - slot_row.running_at_most
                   >= wanted - cardinality(labels) THEN
                    n := slot_row.running_at_most;
                ELSE
                    n := (SELECT count(*) FROM rota.job AS j
                          WHERE j.status = 'running' AND j.type = lim.type AND j.limit_slot = s);
                END IF;
                room := least(wanted - cardinality(labels),
                              rota.limit_share(lim.concurrency, s) - n);
                visited := visited || s;
                visited_bound := visited_bound || slot_row.running_at_most;
                visited_at_most := visited_at_most || n;
                visited_full := visited_full || (room < wanted - cardinality(labels));
                visited_held := visited_held || slot_row.held_back;
                visited_room := visited_room || greatest(room, 0);
                CONTINUE WHEN room < 1;
                IF cursor_slot IS NULL THEN
                    cursor_slot := s;
                    cursor_key := slot_row.group_cursor;
                END IF;
                labels := labels || array_fill(s::smallint, ARRAY[room]);
            END LOOP;
            picked := '{}';
            IF cardinality(labels) > 0 THEN
                SELECT * INTO pick FROM rota.pick_in_turn(lim.type, cursor_key,
                                                          cardinality(labels), NULL, '{}', 0,
                                                          at, since -> lim.type);
                picked := pick.picked;
            END IF;
            -- Held back: the slots it locked had less room than it wanted. Those
            -- that were full are marked, the others cleared. Each slot's bound
            -- becomes what ran in it and what this claim starts there (the jobs
            -- picked take the labels in order, each slot's room in turn). Both
            -- are written on change only.
            held := cardinality(labels) < wanted;
            labelled := 0;
            FOR k IN 1 .. cardinality(visited) LOOP
                n := visited_at_most[k]
                     + least(greatest(cardinality(picked) - labelled, 0), visited_room[k]);
                labelled := labelled + visited_room[k];
                IF (held AND visited_full[k]) IS DISTINCT FROM visited_held[k]
                   OR n IS DISTINCT FROM visited_bound[k] THEN
                    UPDATE rota.job_limit_slot AS ls
                    SET held_back = (held AND visited_full[k]), running_at_most = n
                    WHERE ls.type = lim.type AND ls.slot = visited[k];
                END IF;
            END LOOP;
            CONTINUE WHEN cardinality(picked) = 0;
            IF pick.next_cursor IS DISTINCT FROM cursor_key THEN
                UPDATE rota.job_limit_slot AS ls SET group_cursor = pick.next_cursor
                WHERE ls.type = lim.type AND ls.slot = cursor_slot;
            END IF;
            RETURN QUERY
            SELECT p.id, labels[p.n] FROM unnest(picked) WITH ORDINALITY AS p(id, n);
            wanted := wanted - cardinality(picked);
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
            -- Every slot is locked here: the bounds of the slot path, which
            -- these jobs are not counted in, are forgotten.
            UPDATE rota.job_limit_slot AS ls SET running_at_most = NULL
            WHERE ls.type = lim.type AND ls.running_at_most IS NOT NULL;
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

-- A job made running in a slot by any statement but a claim: the slot's bound
-- may now be under what runs there, so it is forgotten, and the slot's next
-- claim counts. (The UPDATE waits for a claim that holds the slot; that
-- claim's bound is written first, then forgotten.)
CREATE FUNCTION rota.slot_bound_forgotten() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.job_limit_slot AS ls SET running_at_most = NULL
    WHERE ls.type = NEW.type AND ls.slot = NEW.limit_slot AND ls.running_at_most IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_slot_bound_insert AFTER INSERT ON rota.job
FOR EACH ROW WHEN (NEW.status = 'running' AND NEW.limit_slot IS NOT NULL)
EXECUTE FUNCTION rota.slot_bound_forgotten();

-- Every claim asks this of each job it starts: a job with no slot stops at
-- the second test, one a claim starts in a slot at the last (the setting
-- rota.pick_limited makes for its transaction).
CREATE TRIGGER job_slot_bound_update AFTER UPDATE OF status, limit_slot, type ON rota.job
FOR EACH ROW WHEN (NEW.status = 'running' AND NEW.limit_slot IS NOT NULL
                   AND (OLD.status <> 'running' OR OLD.limit_slot IS DISTINCT FROM NEW.limit_slot
                        OR OLD.type <> NEW.type)
                   AND current_setting('rota.claiming', true) IS DISTINCT FROM 'on')
EXECUTE FUNCTION rota.slot_bound_forgotten();
