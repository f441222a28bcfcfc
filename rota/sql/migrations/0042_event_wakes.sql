-- An emit wakes its waiters whatever its transaction's isolation, and never
-- deadlocks with the wake pass.
--
-- rota.emit (migration 0040) ended the open waits on its key, then made their
-- jobs ready: it locked a wait's row before its job's, where the wake pass
-- (wake_due) and a suspension lock the job's first. An emit as a wait's
-- timeout passed could deadlock with the pass, and its error rolled the
-- caller's transaction back, the event with it. Both lock the jobs' rows
-- first now, in id order (rota.wake_event_waits).
--
-- In a REPEATABLE READ or SERIALIZABLE transaction, every statement of the
-- emit reads the transaction's snapshot: a wait committed after that snapshot
-- was taken, yet before the emit took the key's lock, was invisible to it, and
-- its job waited for ever (the wait had looked for the event before it was
-- stored). Such an emit leaves its key in rota.job_event_recheck, and the wake
-- pass, whose statements read a fresh snapshot, wakes the key's waiters that
-- are still open (rota.wake_rechecked): within one pass of the reaper.

CREATE TABLE rota.job_event_recheck (
    key text PRIMARY KEY
);

-- The key's open waits end by 'event' and their waiting jobs are ready again;
-- returns the ids made ready. Takes the key's lock, as rota.suspend does before
-- it looks for the event, so an emit comes before the look or wakes the job
-- after, never between.
CREATE FUNCTION rota.wake_event_waits(p_key text) RETURNS SETOF bigint
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
        SET ended_at = now(), ended_by = 'event'
        FROM rota.job AS j
        WHERE w.kind = 'event' AND w.ended_at IS NULL AND w.event_key = p_key
          AND j.id = w.job_id AND j.status IN ('ready', 'running', 'waiting')
        RETURNING w.job_id
    )
    UPDATE rota.job AS j SET status = 'ready', run_at = now()
    FROM ended WHERE j.id = ended.job_id AND j.status = 'waiting'
    RETURNING j.id;
END
$$;

CREATE OR REPLACE FUNCTION rota.emit(key text, payload jsonb DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    stored integer;
    woken  integer;
BEGIN
    IF emit.key IS NULL THEN
        RAISE EXCEPTION 'rota.emit: the key must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('rota.event:' || emit.key, 0));
    INSERT INTO rota.job_event (key, payload, emitted_at)
    VALUES (emit.key, emit.payload, now())
    ON CONFLICT (key) DO NOTHING;
    GET DIAGNOSTICS stored = ROW_COUNT;
    IF stored > 0 AND current_setting('transaction_isolation') <> 'read committed' THEN
        INSERT INTO rota.job_event_recheck (key) VALUES (emit.key) ON CONFLICT DO NOTHING;
    END IF;
    SELECT count(*) INTO woken FROM rota.wake_event_waits(emit.key);
    IF woken > 0 THEN
        PERFORM pg_notify('rota_jobs', '');
    END IF;
    RETURN woken;
END
$$;

-- The wake pass's look at keys emitted where waits could not be seen: up to
-- p_limit of them, each woken as an emit wakes (rota.wake_event_waits);
-- returns the ids made ready. SKIP LOCKED keeps passes out of each other's way.
CREATE FUNCTION rota.wake_rechecked(p_limit integer) RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    picked text;
    found  boolean := false;
BEGIN
    FOR picked IN
        DELETE FROM rota.job_event_recheck AS r
        WHERE r.key IN (SELECT c.key FROM rota.job_event_recheck AS c
                        ORDER BY c.key LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING r.key
    LOOP
        RETURN QUERY SELECT * FROM rota.wake_event_waits(picked);
        found := found OR FOUND;
    END LOOP;
    IF found THEN
        PERFORM pg_notify('rota_jobs', '');
    END IF;
END
$$;
