-- A wait of a job that has ended stays as the job left it.
--
-- rota.emit ended every open wait on its key, and a child's end every open
-- gather of its parent, whatever the waiting job's status: the wait of a job
-- cancelled while it waited read "ended by event" (or "by children", since a
-- cancelled parent's children are cancelled with it) from the moment after
-- the cancel, where `rota jobs show` and the console promise "not ended: job
-- cancelled". Both now end the waits of jobs that are ready, running or
-- waiting only. (An open wait of a ready or running job is one its run comes
-- back to: a wait without a timeout woken after ten years, say.)

CREATE OR REPLACE FUNCTION rota.emit(key text, payload jsonb DEFAULT NULL) RETURNS integer
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
        FROM rota.job AS j
        WHERE w.kind = 'event' AND w.ended_at IS NULL AND w.event_key = emit.key
          AND j.id = w.job_id AND j.status IN ('ready', 'running', 'waiting')
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

CREATE OR REPLACE FUNCTION rota.child_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- The parent's row is locked first, whatever its status, and the children
    -- read after (see 0025): an ended parent's gather is left alone.
    PERFORM FROM rota.job WHERE id = NEW.parent_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH ended AS (
        UPDATE rota.job_wait AS w
        SET ended_at = now(), ended_by = 'children'
        FROM rota.job AS parent
        WHERE w.job_id = NEW.parent_id AND w.kind = 'children' AND w.ended_at IS NULL
          AND parent.id = NEW.parent_id AND parent.status IN ('ready', 'running', 'waiting')
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
