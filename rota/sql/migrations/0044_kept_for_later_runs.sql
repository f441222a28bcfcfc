-- What a durable job's later runs read is kept: the payload a wait got, and
-- the archived children of a parent still in rota.job.
--
-- A run that came back to a wait ended by 'event' looked the payload up again
-- by key in rota.job_event, and the archive deletes events after their
-- retention (30 days by default) whether or not a wait had them: a job that
-- got its event, then slept past the retention, raised TimedOut on its next
-- run (the docs' order, shipped, took the path that refunds it), and a key
-- emitted again after the deletion handed the new payload to a wait that had
-- ended with the old one. Every statement that ends a wait by 'event' now
-- writes the event's payload on the wait's row (rota.job_wait.payload) and a
-- later run reads it from there. An emit without a payload is kept as JSON
-- null, so SQL NULL on a wait ended by 'event' means the payload is not known:
-- a wait that ended before this migration whose event was deleted (or emitted
-- again) since.

ALTER TABLE rota.job_wait ADD COLUMN payload jsonb;

-- Waits ended by 'event' before this migration take their event's payload
-- while it is there, unless the key was emitted again after the wait ended
-- (that payload is not the one the wait got).
UPDATE rota.job_wait AS w SET payload = coalesce(e.payload, 'null'::jsonb)
FROM rota.job_event AS e
WHERE w.kind = 'event' AND w.ended_by = 'event' AND e.key = w.event_key
  AND e.emitted_at <= w.ended_at;

-- rota.wake_event_waits (migration 0042), the event's payload written on each
-- wait it ends. It ends none without the event (the wake pass's recheck of a
-- key whose event the archive deleted meanwhile).
CREATE OR REPLACE FUNCTION rota.wake_event_waits(p_key text) RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('rota.event:' || p_key, 0));
    -- The jobs' rows before their waits', in id order: the order of the wake
    -- pass and of a suspension (a wake pass skips a row locked here).
    PERFORM FROM rota.job AS j
    WHERE j.id IN (SELECT w.job_id FROM rota.job_wait AS w
                   WHERE w.kind = 'event' AND w.ended_at IS NULL AND w.event_key = p_key)
    ORDER BY j.id
    FOR NO KEY UPDATE;
    RETURN QUERY
    WITH ended AS (
        UPDATE rota.job_wait AS w
        SET ended_at = now(), ended_by = 'event', payload = coalesce(e.payload, 'null'::jsonb)
        FROM rota.job AS j, rota.job_event AS e
        WHERE w.kind = 'event' AND w.ended_at IS NULL AND w.event_key = p_key
          AND j.id = w.job_id AND j.status IN ('ready', 'running', 'waiting')
          AND e.key = p_key
        RETURNING w.job_id
    )
    UPDATE rota.job AS j SET status = 'ready', run_at = now()
    FROM ended WHERE j.id = ended.job_id AND j.status = 'waiting'
    RETURNING j.id;
END
$$;

-- rota.suspend (migration 0041), the payload written on a wait that finds its
-- event already emitted.
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
    event    jsonb;
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
    IF p_kind = 'event' THEN
        SELECT coalesce(e.payload, 'null'::jsonb) INTO event
        FROM rota.job_event AS e WHERE e.key = p_event_key;
    END IF;
    ended := CASE
        WHEN event IS NOT NULL THEN 'event'
        WHEN p_kind = 'children' AND rota.children_ended(p_children) THEN 'children'
        WHEN deadline <= clock THEN 'time'
    END;
    IF ended IS NOT NULL THEN
        UPDATE rota.job_wait SET ended_at = clock, ended_by = ended, payload = event
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

-- A parent reads its children's outcomes on every run, from rota.job_archive
-- once they are archived, and the archive's retention deleted them: the
-- parent's next run failed ("job N is not a child of job M"). The deletion of
-- archived rows (delete_archived) keeps the children of a parent still in
-- rota.job now, found by rota.job_archive.parent_id: a child archived before
-- migration 0038 has none. Such children of parents
-- still in rota.job (whose rota.job_child rows are kept with them) take it.
UPDATE rota.job_archive AS a SET parent_id = c.parent_id
FROM rota.job_child AS c
WHERE a.parent_id IS NULL AND c.child_id = a.id;
