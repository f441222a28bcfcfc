-- Flow control: job groups, limits that bind every worker at once, and keys
-- unique within a window or while their job is active.

-- A job's concurrency group (a tenant, an account, a remote host).
ALTER TABLE rota.job ADD COLUMN IF NOT EXISTS group_key text;
ALTER TABLE rota.job_archive ADD COLUMN IF NOT EXISTS group_key text;
-- The group of every job a schedule enqueues.
ALTER TABLE rota.schedule ADD COLUMN group_key text;

ALTER TABLE rota.job
    -- The key of a job enqueued with unique_for or unique_active (never also
    -- its idempotency_key, which stays unique for as long as the row exists).
    ADD COLUMN unique_key text,
    -- At most one ready or running job holds the key (job_unique_active_idx).
    ADD COLUMN unique_active boolean NOT NULL DEFAULT false;

-- unique_active: the index refuses a second active job with the key, however
-- many connections enqueue it at once; a finished job leaves the index.
CREATE UNIQUE INDEX job_unique_active_idx ON rota.job (unique_key)
    WHERE unique_active AND status IN ('ready', 'running');

-- unique_for: who holds a key, and until when. An enqueue takes the key over
-- only once its window has passed (INSERT ... ON CONFLICT DO UPDATE ... WHERE
-- sees the latest row, so concurrent enqueues agree on one holder).
CREATE TABLE rota.job_unique_key (
    key    text        PRIMARY KEY,
    job_id bigint      NOT NULL,
    until  timestamptz NOT NULL
);

-- Ready jobs by type and group, each group in claim order. A limited type's
-- claim walks its groups in turn from here, a few entries per group, and
-- jobs without a group are one range at the end of the type. It also answers
-- the per-type counts job_ready_type_idx answered, so it replaces it: no job
-- pays an index entry more than before.
CREATE INDEX job_group_ready_idx ON rota.job (type, group_key, priority, run_at, id)
    WHERE status = 'ready';
DROP INDEX IF EXISTS rota.job_ready_type_idx;

-- Limits per job type, read and locked by the claim of that type only.
CREATE TABLE rota.job_limit (
    type              text        PRIMARY KEY,
    -- At most this many jobs of the type running at once, across all workers.
    concurrency       integer     CHECK (concurrency >= 1),
    -- At most this many running at once per group of the type.
    group_concurrency integer     CHECK (group_concurrency >= 1),
    -- At most `rate` starts in any `per_seconds` seconds.
    rate              integer     CHECK (rate BETWEEN 1 AND 10000),
    per_seconds       double precision CHECK (per_seconds > 0),
    -- The starts of the last per_seconds (at most `rate` of them).
    starts            timestamptz[] NOT NULL DEFAULT '{}',
    -- The last group the claim took jobs from: the next claim starts after it.
    -- NULL: start at the first group.
    group_cursor      text,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate IS NULL) = (per_seconds IS NULL)),
    CHECK (num_nonnulls(concurrency, group_concurrency, rate) > 0)
);

-- Up to `n` due ready jobs of one group of a type (named, or the jobs without
-- a group when `ungrouped`), locked, in claim order: one range of
-- job_group_ready_idx per priority, stopping at the first job not yet due.
CREATE FUNCTION rota.ready_of_group(
    job_type text, key text, ungrouped boolean, n integer, at timestamptz
) RETURNS bigint[]
LANGUAGE plpgsql AS $$
BEGIN
    IF ungrouped THEN
        RETURN ARRAY(
            SELECT c.id FROM generate_series(0, 9) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT j.id FROM rota.job AS j
                WHERE j.status = 'ready' AND j.type = job_type AND j.group_key IS NULL
                  AND j.priority = p.priority AND j.run_at <= at
                ORDER BY j.run_at, j.id
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

-- The claim of limited types. Called from claim_jobs (rota/sql/queries.sql) in
-- the same statement, it locks the limit rows of the types it may claim (in
-- type order, so claims never deadlock) and, holding them, counts what runs.
-- A VOLATILE function sees a new snapshot for each statement: the counts see
-- every claim committed by the previous holder of the lock, and the lock is
-- held until this claim commits. That is what keeps a limit exact however many
-- workers claim: two claims of one limited type never count at once.
-- Groups are visited in turn from the one after the cursor, once each, and a
-- visit takes at most the group's room: a group with a long backlog holds up
-- the next group for one claim at most. Jobs without a group are one group,
-- visited after the named ones.
CREATE FUNCTION rota.claim_limited(
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
    picked bigint[];
    group_room integer;
    cursor_key text;
    next_key text;
    none_visited boolean;
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
        FOR UPDATE
    LOOP
        EXIT WHEN wanted < 1;
        room := wanted;
        recent := '{}';
        IF lim.rate IS NOT NULL THEN
            recent := ARRAY(SELECT s FROM unnest(lim.starts) AS s
                            WHERE s > at - make_interval(secs => lim.per_seconds) ORDER BY s);
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

        picked := '{}';
        cursor_key := lim.group_cursor;
        none_visited := false;
        LOOP
            IF cursor_key IS NULL THEN
                next_key := (SELECT j.group_key FROM rota.job AS j
                             WHERE j.status = 'ready' AND j.type = lim.type
                               AND j.group_key IS NOT NULL
                             ORDER BY j.group_key LIMIT 1);
            ELSE
                next_key := (SELECT j.group_key FROM rota.job AS j
                             WHERE j.status = 'ready' AND j.type = lim.type
                               AND j.group_key > cursor_key
                             ORDER BY j.group_key LIMIT 1);
            END IF;
            IF next_key IS NULL THEN
                -- Past the last named group: the jobs without a group, then around.
                EXIT WHEN none_visited;
                none_visited := true;
                group_room := least(room - cardinality(picked),
                                    coalesce(lim.group_concurrency - running_none, room));
                IF group_room > 0 THEN
                    picked := picked || rota.ready_of_group(lim.type, NULL, true, group_room, at);
                END IF;
                cursor_key := NULL;
                EXIT WHEN lim.group_cursor IS NULL;  -- started at the first group
            ELSE
                EXIT WHEN none_visited AND next_key > lim.group_cursor;  -- around once
                group_room := least(
                    room - cardinality(picked),
                    coalesce(lim.group_concurrency
                             - coalesce((running_named ->> next_key)::integer, 0), room));
                IF group_room > 0 THEN
                    picked := picked
                              || rota.ready_of_group(lim.type, next_key, false, group_room, at);
                END IF;
                cursor_key := next_key;
            END IF;
            EXIT WHEN cardinality(picked) >= room;
        END LOOP;

        CONTINUE WHEN cardinality(picked) = 0;
        UPDATE rota.job_limit AS l
        SET group_cursor = cursor_key,
            starts = CASE WHEN l.rate IS NULL THEN '{}'::timestamptz[]
                          ELSE recent || array_fill(at, ARRAY[cardinality(picked)]) END
        WHERE l.type = lim.type;
        RETURN QUERY
        UPDATE rota.job AS j
        SET status = 'running',
            locked_by = worker,
            locked_until = at + make_interval(secs => lease),
            attempts = j.attempts + 1,
            started_at = at
        WHERE j.id = ANY(picked)
        RETURNING j.*;
        wanted := wanted - cardinality(picked);
    END LOOP;
END
$$;
