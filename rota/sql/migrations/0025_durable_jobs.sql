-- Durable jobs: steps stored once per job and name, sleeps and waits that
-- free the worker (status `waiting`), events that wake them, and children
-- that fan in to their parent (docs/durable-jobs.md).
--
-- State machine (rota.jobs.Status):
--   ready --claim--> running --suspend (sleep, wait_for, gather)--> waiting
--   waiting --due (rota.wake_due), emit (rota.emit), last child ended--> ready
--   waiting --cancel--> cancelled
-- A suspension ends the attempt without counting it (attempts - 1, as a
-- release does) and frees the worker's slot (and a limit's slot: limits count
-- running rows only). A waiting row's run_at is when it is next looked at: the
-- end of its sleep or the timeout of its wait; a wait with no deadline looks
-- again after ten years (the longest delay of a job), and waits once more.

ALTER TABLE rota.job DROP CONSTRAINT IF EXISTS job_status_check;
ALTER TABLE rota.job ADD CONSTRAINT job_status_check
    CHECK (status IN ('ready', 'running', 'waiting', 'done', 'failed', 'dead', 'cancelled'));

-- A child's parent (rota.job_child holds the name it was spawned under).
ALTER TABLE rota.job ADD COLUMN parent_id bigint;
CREATE INDEX job_parent_idx ON rota.job (parent_id) WHERE parent_id IS NOT NULL;

-- The waiting rows, by when they are next due: the wake pass walks it, and
-- status and metrics count waiting jobs by type from it.
CREATE INDEX job_waiting_idx ON rota.job (run_at, type) WHERE status = 'waiting';

-- A key held while its job is active: a waiting job is active.
DROP INDEX rota.job_unique_active_idx;
CREATE UNIQUE INDEX job_unique_active_idx ON rota.job (unique_key)
    WHERE unique_active AND status IN ('ready', 'running', 'waiting');

-- One row per completed step: a later attempt answers the step from here.
CREATE TABLE rota.job_step (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL,
    result      jsonb,
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, name)
);

-- Every sleep, wait and gather of a job, by the name its run gives it
-- ('sleep:<n>' for the n-th sleep of a run, 'event:<key>', 'gather:<n>').
-- A run that comes back to a wait reads how it ended: ended_by 'time' is a
-- sleep done or a wait timed out, 'event' an emit, 'children' the last child.
CREATE TABLE rota.job_wait (
    job_id     bigint      NOT NULL,
    name       text        NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('sleep', 'event', 'children')),
    event_key  text,
    children   bigint[],
    until      timestamptz,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    ended_by   text        CHECK (ended_by IN ('time', 'event', 'children')),
    PRIMARY KEY (job_id, name)
);
CREATE INDEX job_wait_event_idx ON rota.job_wait (event_key)
    WHERE kind = 'event' AND ended_at IS NULL;

-- Emitted events. The first emit of a key wins and is kept (for the archive's
-- event retention, 30 days by default): a wait that comes after it returns its
-- payload at once, so an emit that beats its waiter is never lost; a later
-- emit of the key changes nothing.
CREATE TABLE rota.job_event (
    key        text        PRIMARY KEY,
    payload    jsonb,
    emitted_at timestamptz NOT NULL
);
-- The archive deletes events past their retention (ArchiveSettings), oldest first.
CREATE INDEX job_event_emitted_idx ON rota.job_event (emitted_at);

-- The children a parent spawned, by name: a resumed run that spawns the same
-- name finds the same child, even once the child has been archived.
CREATE TABLE rota.job_child (
    parent_id bigint NOT NULL,
    name      text   NOT NULL,
    child_id  bigint NOT NULL,
    PRIMARY KEY (parent_id, name)
);

-- A job's steps, waits and children go with it (archived or deleted).
CREATE FUNCTION rota.forget_job_durable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM rota.job_step AS s USING old_rows AS o WHERE s.job_id = o.id;
    DELETE FROM rota.job_wait AS w USING old_rows AS o WHERE w.job_id = o.id;
    DELETE FROM rota.job_child AS c USING old_rows AS o WHERE c.parent_id = o.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_forget_durable
    AFTER DELETE ON rota.job
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rota.forget_job_durable();

-- Whether every job of `ids` has ended (a job no longer in rota.job was
-- archived, so it has). Looked at from the last id back: children end
-- roughly in the order they were spawned, so the first one looked at is
-- usually one still running, and the loop stops there.
CREATE FUNCTION rota.children_ended(ids bigint[]) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    FOR i IN REVERSE coalesce(array_upper(ids, 1), 0) .. 1 LOOP
        PERFORM FROM rota.job
        WHERE id = ids[i] AND status IN ('ready', 'running', 'waiting');
        IF FOUND THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- A child ended: wake its parent if it waits on its children and this was
-- the last of them. The parent's row is locked first, whatever its status,
-- and the children are read after (a new snapshot): a parent suspending at
-- the same moment (rota.suspend locks its own row, then reads its children)
-- either sees this child ended or is woken here, never neither.
CREATE FUNCTION rota.child_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM rota.job WHERE id = NEW.parent_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH ended AS (
        UPDATE rota.job_wait AS w
        SET ended_at = now(), ended_by = 'children'
        WHERE w.job_id = NEW.parent_id AND w.kind = 'children' AND w.ended_at IS NULL
          AND NEW.id = ANY(w.children)
          AND rota.children_ended(w.children)
        RETURNING w.job_id
    )
    UPDATE rota.job AS j SET status = 'ready', run_at = now()
    FROM ended WHERE j.id = ended.job_id AND j.status = 'waiting';
    IF FOUND THEN
        PERFORM pg_notify('rota_jobs', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_child_ended
    AFTER UPDATE OF status ON rota.job
    FOR EACH ROW
    WHEN (NEW.parent_id IS NOT NULL
          AND NEW.status IN ('done', 'failed', 'dead', 'cancelled')
          AND OLD.status IN ('ready', 'running', 'waiting'))
    EXECUTE FUNCTION rota.child_ended();

-- Suspend a running job on one of its waits, if this worker still holds its
-- lease at that attempt. Returns how the wait ended, if it has ('time': a
-- sleep's end or a wait's timeout came; 'event'; 'children'), the job running
-- on and its handler going on; 'lost' when the lease is not held (nothing
-- written); else 'waiting': the job waits, the attempt not counted. An event
-- wait takes the key's lock before it looks for the event, as rota.emit does
-- before it wakes the waiters, so an emit either comes before the look or
-- wakes the job after, never between.
CREATE FUNCTION rota.suspend(
    p_job bigint, p_attempt integer, p_worker text, p_name text, p_kind text,
    p_event_key text, p_children bigint[], p_seconds float8, p_now timestamptz
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    clock    timestamptz := coalesce(p_now, now());
    deadline timestamptz;
    ended    text;
BEGIN
    IF p_kind = 'event' THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('rota.event:' || p_event_key, 0));
    END IF;
    -- A wait that ended stays ended: a run coming back to it goes on.
    SELECT w.ended_by INTO ended FROM rota.job_wait AS w
    WHERE w.job_id = p_job AND w.name = p_name;
    IF ended IS NOT NULL THEN
        RETURN ended;
    END IF;
    PERFORM FROM rota.job
    WHERE id = p_job AND status = 'running' AND locked_by = p_worker AND attempts = p_attempt
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    INSERT INTO rota.job_wait AS w (job_id, name, kind, event_key, children, until, started_at)
    VALUES (p_job, p_name, p_kind, p_event_key, p_children,
            clock + make_interval(secs => p_seconds), clock)
    ON CONFLICT (job_id, name) DO UPDATE SET children = excluded.children
    RETURNING w.until INTO deadline;
    ended := CASE
        WHEN p_kind = 'event' AND EXISTS (SELECT FROM rota.job_event WHERE key = p_event_key)
            THEN 'event'
        WHEN p_kind = 'children' AND rota.children_ended(p_children) THEN 'children'
        WHEN deadline <= clock THEN 'time'
    END;
    IF ended IS NOT NULL THEN
        UPDATE rota.job_wait SET ended_at = clock, ended_by = ended
        WHERE job_id = p_job AND name = p_name;
        RETURN ended;
    END IF;
    UPDATE rota.job
    SET status = 'waiting',
        run_at = coalesce(deadline, clock + interval '10 years'),
        attempts = attempts - 1,
        releases = 0,
        locked_until = NULL
    WHERE id = p_job;
    -- A limit's slot came free: wake idle workers, as an outcome does.
    PERFORM pg_notify('rota_jobs', '')
    FROM rota.job AS j JOIN rota.job_limit AS l ON l.type = j.type WHERE j.id = p_job;
    RETURN 'waiting';
END
$$;

-- The first emit of `key` is kept with its payload, and every job waiting on
-- the key is ready again at once (listening workers are woken). Returns the
-- number of jobs woken. Runs as its owner with a fixed search_path, so a role
-- granted only EXECUTE on it (`rota migrate --grant-enqueue`) can emit.
CREATE FUNCTION rota.emit(key text, payload jsonb DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    woken integer;
BEGIN
    IF emit.key IS NULL THEN
        RAISE EXCEPTION 'rota.emit: the key must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('rota.event:' || emit.key, 0));
    INSERT INTO rota.job_event (key, payload, emitted_at)
    VALUES (emit.key, emit.payload, now())
    ON CONFLICT (key) DO NOTHING;
    WITH ended AS (
        UPDATE rota.job_wait AS w
        SET ended_at = now(), ended_by = 'event'
        WHERE w.kind = 'event' AND w.ended_at IS NULL AND w.event_key = emit.key
        RETURNING w.job_id
    )
    UPDATE rota.job AS j SET status = 'ready', run_at = now()
    FROM ended WHERE j.id = ended.job_id AND j.status = 'waiting';
    GET DIAGNOSTICS woken = ROW_COUNT;
    IF woken > 0 THEN
        PERFORM pg_notify('rota_jobs', '');
    END IF;
    RETURN woken;
END
$$;
REVOKE ALL ON FUNCTION rota.emit(text, jsonb) FROM PUBLIC;
