-- Limit slots: a concurrency limit held by claims that run side by side.
--
-- Before, every claim of a limited type locked the type's row in
-- rota.job_limit until it committed, so two workers' claims of one limited
-- type took turns (a two-process drain under a limit that never binds ran at
-- 0.83 of the plain one).
-- A limit that is only a concurrency (no group_concurrency, no rate) is now
-- split into four slots (rota.limit_slots()), each a row of
-- rota.job_limit_slot holding a share of it (the shares add up to the
-- concurrency). A claim locks the slots it finds free (SKIP LOCKED: it never
-- waits for another claim), counts the running jobs claimed under each
-- (rota.job.limit_slot), and claims at most the slot's share less those. Each slot's count is exact for the same reason
-- the limit row's was (the lock is held until the claim commits, and the next
-- holder counts afresh), and the shares add up to the limit, so the limit is
-- exact however many claims run at once.
--
-- The slot path is taken only while the running jobs of the type fit their
-- slots: a job running with no slot (claimed before its limit was set, or
-- before this migration) or a slot over its share (the limit was lowered)
-- sends the claim down the path of one row, which locks the limit row and
-- every slot, so no slot claim runs beside it, and counts every running job.
-- Limits with group_concurrency or rate always take that path.

ALTER TABLE rota.job ADD COLUMN limit_slot smallint;

-- The running jobs of each slot, counted by every claim of the slot.
CREATE INDEX job_limit_slot_idx ON rota.job (type, limit_slot)
    WHERE status = 'running' AND limit_slot IS NOT NULL;

-- Made with the limit and removed with it (by triggers: no foreign key, so
-- that rota.job_limit can still be truncated alone; slots left behind are taken
-- up again by the type's next limit).
CREATE TABLE rota.job_limit_slot (
    type         text     NOT NULL,
    slot         smallint NOT NULL CHECK (slot >= 0),
    -- The last group a claim of this slot took jobs from.
    group_cursor text,
    PRIMARY KEY (type, slot)
);

-- A limit's slots: as many as rota.limit_slots() says, made with the limit.
CREATE FUNCTION rota.limit_slots() RETURNS integer
LANGUAGE sql IMMUTABLE AS 'SELECT 4';

-- Slot `s`'s share of a concurrency `c`: c split as evenly as it goes.
CREATE FUNCTION rota.limit_share(c integer, s integer) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT c / rota.limit_slots() + CASE WHEN s < c % rota.limit_slots() THEN 1 ELSE 0 END
$$;

CREATE FUNCTION rota.job_limit_made() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.job_limit_slot (type, slot)
    SELECT NEW.type, s FROM generate_series(0, rota.limit_slots() - 1) AS s
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_limit_slots
    AFTER INSERT ON rota.job_limit
    FOR EACH ROW EXECUTE FUNCTION rota.job_limit_made();

CREATE FUNCTION rota.job_limit_cleared() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM rota.job_limit_slot AS ls WHERE ls.type = OLD.type;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_limit_slots_cleared
    AFTER DELETE ON rota.job_limit
    FOR EACH ROW EXECUTE FUNCTION rota.job_limit_cleared();

INSERT INTO rota.job_limit_slot (type, slot)
SELECT l.type, s FROM rota.job_limit AS l, generate_series(0, rota.limit_slots() - 1) AS s
ON CONFLICT DO NOTHING;

-- Up to `room` ready jobs of a type, the groups visited in turn from the one
-- after `cursor_key` (NULL: from the first), each group taking at most its
-- room under `group_limit` (NULL: no limit per group) given what runs in it
-- (`running_named` by group, `running_none` without one). Returns the jobs
-- picked (locked) and where the next claim starts.
CREATE FUNCTION rota.pick_in_turn(
    job_type text, cursor_key text, room integer, group_limit integer,
    running_named jsonb, running_none integer, at timestamptz,
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
                picked := picked || rota.ready_of_group(job_type, NULL, true, group_room, at);
            END IF;
            key := NULL;
            EXIT WHEN cursor_key IS NULL;  -- started at the first group
        ELSE
            EXIT WHEN none_visited AND next_key > cursor_key;  -- around once
            group_room := least(
                room - cardinality(picked),
                coalesce(group_limit - coalesce((running_named ->> next_key)::integer, 0), room));
            IF group_room > 0 THEN
                picked := picked || rota.ready_of_group(job_type, next_key, false, group_room, at);
            END IF;
            key := next_key;
        END IF;
        EXIT WHEN cardinality(picked) >= room;
    END LOOP;
    next_cursor := key;
END
$$;

-- Start the picked jobs of a limited type: running under `worker`'s lease,
-- each in slot `one_slot`, or, when that is NULL, in the slot at its place in
-- `labels` (NULL past its end). (Not `slot`: rota.job has a column of that
-- name, a schedule's slot, which a parameter's name would not override.)
CREATE FUNCTION rota.start_limited(
    picked bigint[], one_slot integer, labels smallint[], worker text,
    lease double precision, at timestamptz
) RETURNS SETOF rota.job
LANGUAGE sql AS $$
    UPDATE rota.job AS j
    SET status = 'running',
        locked_by = worker,
        locked_until = at + make_interval(secs => lease),
        attempts = j.attempts + 1,
        started_at = at,
        limit_slot = coalesce(one_slot, labels[array_position(picked, j.id)])
    WHERE j.id = ANY(picked)
    RETURNING j.*
$$;

-- The claim of limited types, called from claim_jobs (rota/sql/queries.sql) in
-- the same statement. A VOLATILE function sees a new snapshot for each
-- statement: a count made after a lock is taken sees every claim committed
-- by the lock's previous holder, and the lock is held until this claim
-- commits. Limits are visited in type order; a claim waits for a lock only on
-- the path of one row, and only for the locks of the type it is at, so claims
-- never deadlock.
CREATE OR REPLACE FUNCTION rota.claim_limited(
    at timestamptz, types text[], wanted integer, worker text, lease double precision
) RETURNS SETOF rota.job
LANGUAGE plpgsql AS $$
DECLARE
    lim rota.job_limit;
    room integer;
    recent timestamptz[];
    running_total integer;
    running_named jsonb;
    running_none integer;
    fit boolean;
    slot_row rota.job_limit_slot;
    s integer;
    n integer;
    pick record;
    picked bigint[];
    labels smallint[];
BEGIN
    IF wanted < 1 OR EXISTS (SELECT FROM rota.paused_type WHERE type = '*') THEN
        RETURN;
    END IF;
    FOR lim IN
        SELECT l.* FROM rota.job_limit AS l
        WHERE (types IS NULL OR l.type = ANY(types))
          AND NOT EXISTS (SELECT FROM rota.paused_type AS p WHERE p.type = l.type)
          AND EXISTS (SELECT FROM rota.job AS j
                      WHERE j.status = 'ready' AND j.type = l.type AND j.run_at <= at)
        ORDER BY l.type
    LOOP
        EXIT WHEN wanted < 1;

        -- The path of slots: a concurrency alone, every running job in a slot
        -- and no slot over its share.
        fit := false;
        IF lim.concurrency IS NOT NULL AND lim.group_concurrency IS NULL
           AND lim.rate IS NULL THEN
            SELECT coalesce(bool_and(r.s IS NOT NULL
                                     AND r.n <= rota.limit_share(lim.concurrency, r.s)), true)
            INTO fit
            FROM (SELECT j.limit_slot AS s, count(*) AS n FROM rota.job AS j
                  WHERE j.status = 'running' AND j.type = lim.type
                  GROUP BY j.limit_slot) AS r;
            -- A slot taken away by hand: the path of one row needs none.
            fit := fit AND (SELECT count(*) FROM rota.job_limit_slot AS ls
                            WHERE ls.type = lim.type) = rota.limit_slots();
        END IF;
        IF fit THEN
            -- Each free slot in turn, from one that depends on the session, so
            -- that claims side by side start at different slots.
            FOR s IN
                SELECT (g + pg_backend_pid()) % rota.limit_slots()
                FROM generate_series(0, rota.limit_slots() - 1) AS g
            LOOP
                EXIT WHEN wanted < 1;
                CONTINUE WHEN rota.limit_share(lim.concurrency, s) < 1;
                SELECT * INTO slot_row FROM rota.job_limit_slot AS ls
                WHERE ls.type = lim.type AND ls.slot = s
                FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
                n := (SELECT count(*) FROM rota.job AS j
                      WHERE j.status = 'running' AND j.type = lim.type AND j.limit_slot = s);
                room := least(wanted, rota.limit_share(lim.concurrency, s) - n);
                CONTINUE WHEN room < 1;
                SELECT * INTO pick FROM rota.pick_in_turn(lim.type, slot_row.group_cursor,
                                                          room, NULL, '{}', 0, at);
                CONTINUE WHEN cardinality(pick.picked) = 0;
                IF pick.next_cursor IS DISTINCT FROM slot_row.group_cursor THEN
                    UPDATE rota.job_limit_slot AS ls SET group_cursor = pick.next_cursor
                    WHERE ls.type = lim.type AND ls.slot = s;
                END IF;
                RETURN QUERY
                SELECT * FROM rota.start_limited(pick.picked, s, NULL, worker, lease, at);
                wanted := wanted - cardinality(pick.picked);
            END LOOP;
            CONTINUE;
        END IF;

        -- The path of one row: the limit row and every slot locked (waiting
        -- for the claims of the slots to commit), then every running job counted.
        SELECT l.* INTO lim FROM rota.job_limit AS l WHERE l.type = lim.type FOR UPDATE;
        CONTINUE WHEN NOT FOUND;  -- cleared meanwhile: the unlimited claim takes them
        PERFORM FROM rota.job_limit_slot AS ls WHERE ls.type = lim.type
        ORDER BY ls.slot FOR UPDATE;
        room := wanted;
        recent := '{}';
        IF lim.rate IS NOT NULL THEN
            recent := ARRAY(SELECT x FROM unnest(lim.starts) AS x
                            WHERE x > at - make_interval(secs => lim.per_seconds) ORDER BY x);
            room := least(room, lim.rate - cardinality(recent));
        END IF;
        running_named := '{}';
        running_none := 0;
        IF lim.concurrency IS NOT NULL OR lim.group_concurrency IS NOT NULL THEN
            SELECT coalesce(sum(r.n), 0),
                   coalesce(jsonb_object_agg(r.g, r.n) FILTER (WHERE r.g IS NOT NULL), '{}'),
                   coalesce(sum(r.n) FILTER (WHERE r.g IS NULL), 0)
            INTO running_total, running_named, running_none
            FROM (SELECT j.group_key AS g, count(*) AS n FROM rota.job AS j
                  WHERE j.status = 'running' AND j.type = lim.type
                  GROUP BY j.group_key) AS r;
            IF lim.concurrency IS NOT NULL THEN
                room := least(room, lim.concurrency - running_total);
            END IF;
        END IF;
        CONTINUE WHEN room < 1;

        SELECT * INTO pick FROM rota.pick_in_turn(lim.type, lim.group_cursor, room,
                                                  lim.group_concurrency, running_named,
                                                  running_none, at);
        picked := pick.picked;
        CONTINUE WHEN cardinality(picked) = 0;
        UPDATE rota.job_limit AS l
        SET group_cursor = pick.next_cursor,
            starts = CASE WHEN l.rate IS NULL THEN '{}'::timestamptz[]
                          ELSE recent || array_fill(at, ARRAY[cardinality(picked)]) END
        WHERE l.type = lim.type;
        -- Each job goes to a slot with room under its share, so that the slots
        -- fit again once the jobs running without one have ended. There is
        -- room enough: the shares add up to the concurrency, and the room was
        -- the concurrency less every running job.
        labels := '{}';
        IF lim.concurrency IS NOT NULL THEN
            FOR s IN 0 .. rota.limit_slots() - 1 LOOP
                EXIT WHEN cardinality(labels) >= cardinality(picked);
                n := rota.limit_share(lim.concurrency, s)
                     - (SELECT count(*) FROM rota.job AS j
                        WHERE j.status = 'running' AND j.type = lim.type
                          AND j.limit_slot = s);
                n := least(n, cardinality(picked) - cardinality(labels));
                IF n > 0 THEN
                    labels := labels || array_fill(s::smallint, ARRAY[n]);
                END IF;
            END LOOP;
        END IF;
        RETURN QUERY
        SELECT * FROM rota.start_limited(picked, NULL, labels, worker, lease, at);
        wanted := wanted - cardinality(picked);
    END LOOP;
END
$$;
