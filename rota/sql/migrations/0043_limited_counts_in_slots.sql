-- A group limit's claim counts the running jobs of its type, not every
-- running job.
--
-- The path of one row (a limit with group_concurrency or a rate, or a
-- concurrency not settled) counted the running jobs of its type with
-- rota.running_of_type, a walk of every running job of every type
-- (job_running_idx): no index finds one type's running jobs. A claim visits
-- each limited type with due jobs: with 1,000 limits holding back due jobs
-- (300 of them group limits) beside 33,500 running jobs, the limited part of
-- a claim of every type took 1.25 s (0.33 s with this migration).
--
-- Every job a limited claim starts now carries a slot (rota.job.limit_slot):
-- the jobs of a concurrency as before, the jobs of a group limit alone in turn
-- across the type's slots. Such jobs are found by job_limit_slot_idx (type,
-- limit_slot), among the type's own running rows. A limit with a concurrency
-- or a group limit is settled (rota.job_limit.slots_settled) once every
-- running job of its type is in a slot (within its share, for a concurrency)
-- and no claim that might not have seen the limit is in flight: the same
-- fence as for slots (migration 0020). The path of one row of a settled
-- limit counts through the slots (rota.running_in_slots); of one not yet
-- settled, by the walk, and settles it when it can. Only the path of slots
-- (a concurrency alone) takes a settled limit's slots for its own; a group
-- limit or a rate keeps the path of one row.
--
-- A job made running with no slot by a statement that is no claim (an UPDATE
-- or INSERT of rota.job by hand, which counts no claim in rota.job.claims)
-- unsettles its type's limit, by a trigger: the next claims count every
-- running job again. Before, such a job passed the slots of a settled
-- concurrency uncounted.

-- The running jobs of a type that are in slots, counted by slot and group:
-- every running job of the type, once its limit is settled. Driven from
-- job_limit_slot_idx whatever the statistics say.
CREATE FUNCTION rota.running_in_slots(job_type text)
RETURNS TABLE (limit_slot smallint, group_key text, n bigint)
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$
    SELECT j.limit_slot, j.group_key, count(*)
    FROM rota.job AS j
    WHERE j.status = 'running' AND j.type = job_type AND j.limit_slot IS NOT NULL
    GROUP BY j.limit_slot, j.group_key
$$;

-- Settled: every running job of the type in a slot (within its share, for a
-- concurrency), no claim in flight that might not have seen the limit. As
-- 0020 made it, for a group limit too.
CREATE OR REPLACE FUNCTION rota.settle_slots(job_type text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    lim rota.job_limit;
    holders text[];
    fits boolean;
BEGIN
    SELECT l.* INTO lim FROM rota.job_limit AS l WHERE l.type = job_type;
    IF NOT FOUND OR (lim.concurrency IS NULL AND lim.group_concurrency IS NULL) THEN
        RETURN false;
    END IF;
    IF lim.slots_settled THEN
        RETURN true;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN false;
    END IF;
    holders := ARRAY(
        SELECT DISTINCT k.virtualtransaction FROM pg_locks AS k
        WHERE k.locktype = 'relation'
          AND k.relation = 'rota.job_limit'::regclass
          AND k.database = (SELECT d.oid FROM pg_database AS d
                            WHERE d.datname = current_database())
          AND k.pid IS DISTINCT FROM pg_backend_pid());
    IF lim.slots_fence IS NOT NULL THEN
        holders := ARRAY(SELECT h FROM unnest(lim.slots_fence) AS h WHERE h = ANY(holders));
    END IF;
    IF cardinality(holders) > 0 THEN
        UPDATE rota.job_limit AS l SET slots_fence = holders WHERE l.type = job_type;
        RETURN false;
    END IF;
    -- Every claim that might not have seen the limit has ended: count.
    SELECT coalesce(bool_and(r.limit_slot IS NOT NULL
                             AND (lim.concurrency IS NULL
                                  OR r.n <= rota.limit_share(lim.concurrency, r.limit_slot))),
                    true)
    INTO fits
    FROM (SELECT c.limit_slot, sum(c.n) AS n FROM rota.running_of_type(job_type) AS c
          GROUP BY c.limit_slot) AS r;
    fits := fits AND (SELECT count(*) FROM rota.job_limit_slot AS ls
                      WHERE ls.type = job_type) = rota.limit_slots();
    UPDATE rota.job_limit AS l SET slots_settled = fits, slots_fence = '{}'
    WHERE l.type = job_type;
    RETURN fits;
END
$$;

-- The claim's picks of limited types, as 0033 made them (and 0035 planned
-- them, with sorting off): a group limit's jobs put in slots, and the running
-- jobs of a settled limit counted through its slots.
CREATE OR REPLACE FUNCTION rota.pick_limited(at timestamptz, types text[], wanted integer, since jsonb)
RETURNS TABLE (id bigint, limit_slot smallint)
LANGUAGE plpgsql SET enable_sort = off AS $$
DECLARE
    counted_in_slots boolean;
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
        -- for the claims of the slots to commit), then the running jobs counted.
        SELECT l.* INTO lim FROM rota.job_limit AS l WHERE l.type = lim.type FOR UPDATE;
        CONTINUE WHEN NOT FOUND;  -- cleared meanwhile: the unlimited claim takes them
        PERFORM FROM rota.job_limit_slot AS ls WHERE ls.type = lim.type
        ORDER BY ls.slot FOR UPDATE;
        -- Settled, every running job of the type is in a slot: the count below
        -- reads the type's own running jobs. Otherwise it walks every running
        -- job, and the limit is settled for the claims after this one if it can be.
        counted_in_slots := lim.slots_settled OR rota.settle_slots(lim.type);
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
            WITH c AS MATERIALIZED (
                SELECT * FROM rota.running_in_slots(lim.type) WHERE counted_in_slots
                UNION ALL
                SELECT * FROM rota.running_of_type(lim.type) WHERE NOT counted_in_slots),
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
        -- Each job of a concurrency goes to a slot with room under its share, so
        -- that the slots fit again once the jobs running without one have
        -- ended. There is room enough: the shares add up to the concurrency,
        -- and the room was the concurrency less every running job. The jobs of
        -- a group limit alone go to the slots in turn: in a slot, they are
        -- counted by the type's claims through job_limit_slot_idx.
        labels := '{}';
        IF lim.concurrency IS NOT NULL OR lim.group_concurrency IS NOT NULL THEN
            -- Every slot is locked here: the bounds of the slot path, which
            -- these jobs are not counted in, are forgotten.
            UPDATE rota.job_limit_slot AS ls SET running_at_most = NULL
            WHERE ls.type = lim.type AND ls.running_at_most IS NOT NULL;
        END IF;
        IF lim.concurrency IS NOT NULL THEN
            FOR s IN 0 .. rota.limit_slots() - 1 LOOP
                EXIT WHEN cardinality(labels) >= cardinality(picked);
                n := least(rota.limit_share(lim.concurrency, s) - in_slot[s + 1],
                           cardinality(picked) - cardinality(labels));
                IF n > 0 THEN
                    labels := labels || array_fill(s::smallint, ARRAY[n]);
                END IF;
            END LOOP;
        ELSIF lim.group_concurrency IS NOT NULL THEN
            labels := ARRAY(SELECT (g % rota.limit_slots())::smallint
                            FROM generate_series(0, cardinality(picked) - 1) AS g);
        END IF;
        RETURN QUERY
        SELECT p.id, labels[p.n]::smallint FROM unnest(picked) WITH ORDINALITY AS p(id, n);
        wanted := wanted - cardinality(picked);
    END LOOP;
END
$$;


-- A job made running with no slot by a statement that counts no claim: its
-- limit, if settled, is no longer (the job is in no slot). Claims count a
-- claim (rota.job.claims), so the jobs they start call no function.
-- A fence is forgotten too: the fence noted before this write began does not
-- hold this transaction, and a claim that settled by it would count the
-- running jobs without this one, not yet committed. With no fence, the next
-- claim notes this transaction (it holds a lock on rota.job_limit from here
-- on); and the limit's row stays locked until it commits, so no claim on the
-- path of one row counts before then.
CREATE FUNCTION rota.limit_unsettled_by_hand() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.job_limit AS l SET slots_settled = false, slots_fence = NULL
    WHERE l.type = NEW.type AND (l.slots_settled OR l.slots_fence IS NOT NULL);
    RETURN NULL;
END
$$;

CREATE TRIGGER job_unslotted_insert AFTER INSERT ON rota.job
FOR EACH ROW WHEN (NEW.status = 'running' AND NEW.limit_slot IS NULL)
EXECUTE FUNCTION rota.limit_unsettled_by_hand();

CREATE TRIGGER job_unslotted_update AFTER UPDATE OF status, limit_slot, type ON rota.job
FOR EACH ROW WHEN (NEW.status = 'running' AND NEW.limit_slot IS NULL
                   AND (OLD.status IS DISTINCT FROM 'running' OR OLD.limit_slot IS NOT NULL
                        OR OLD.type IS DISTINCT FROM NEW.type)
                   AND NEW.claims IS NOT DISTINCT FROM OLD.claims)
EXECUTE FUNCTION rota.limit_unsettled_by_hand();
