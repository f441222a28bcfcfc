-- A claim's own number: a run whose lease was taken away writes nothing, even
-- when the same worker claims the job again at the same attempt number.
--
-- A lease was held by (locked_by, attempts). The attempt number goes down when
-- an attempt is given back uncounted (a durable run that stored a step and
-- lost its lease; a suspension) and back to 0 when a dead job is retried, so
-- the same worker's next claim could carry a number an older run of its own
-- still held: that run's outcome, heartbeat, steps and children were taken as
-- the new run's. `claims` counts every claim of a job and nothing lowers it;
-- every write of a run is checked against (locked_by, claims) now. A row
-- written before this migration starts at 0, as a new one does: a worker of
-- this version claims it as claim 1 and holds it by that number.

ALTER TABLE rota.job ADD COLUMN claims integer NOT NULL DEFAULT 0;

-- rota.suspend (migration 0025), its lease checked by the claim's number:
-- p_attempt is the claim's number now (its name kept, as CREATE OR REPLACE
-- keeps a function's parameters).
-- Suspend a running job on one of its waits, if this worker still holds its
-- lease at that attempt. Returns how the wait ended, if it has ('time': a
-- sleep's end or a wait's timeout came; 'event'; 'children'), the job running
-- on and its handler going on; 'lost' when the lease is not held (nothing
-- written); else 'waiting': the job waits, the attempt not counted. An event
-- wait takes the key's lock before it looks for the event, as rota.emit does
-- before it wakes the waiters, so an emit either comes before the look or
-- wakes the job after, never between.
CREATE OR REPLACE FUNCTION rota.suspend(
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
    WHERE id = p_job AND status = 'running' AND locked_by = p_worker AND claims = p_attempt
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
