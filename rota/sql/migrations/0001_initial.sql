-- The queue: one row per job, the whole history of a job in that row.
CREATE TABLE rota.job (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type            text        NOT NULL,
    payload         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key text        UNIQUE,
    status          text        NOT NULL DEFAULT 'ready'
                    CHECK (status IN ('ready', 'running', 'done', 'failed', 'dead')),
    run_at          timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer     NOT NULL DEFAULT 20 CHECK (max_attempts >= 1),
    locked_by       text,
    locked_until    timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    schedule_id     bigint,
    slot            timestamptz
);

-- A queue table churns: every job is inserted, updated twice and later moved
-- out. Vacuum and analyze it after 2% of its rows change instead of 20%, so dead
-- row versions do not pile up in the claiming indexes and the planner's
-- idea of how many rows are ready or running stays close to the truth.
ALTER TABLE rota.job SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- Claiming walks this small partial index only, however many done rows exist.
CREATE INDEX job_ready_idx ON rota.job (run_at, id) WHERE status = 'ready';
-- Per-type age and counts of ready jobs (metrics, autoscaling) without a scan.
CREATE INDEX job_ready_type_idx ON rota.job (type, run_at) WHERE status = 'ready';
-- The reaper looks for expired leases among running rows only.
CREATE INDEX job_running_idx ON rota.job (locked_until) WHERE status = 'running';
-- Dead letters and permanent failures are listed and counted often, found fast.
CREATE INDEX job_failed_idx ON rota.job (status, finished_at) WHERE status IN ('failed', 'dead');
-- Archiving takes the oldest finished rows first.
CREATE INDEX job_finished_idx ON rota.job (finished_at) WHERE status IN ('done', 'failed', 'dead');
-- Forbid policy: is the previous slot's job of a schedule still active?
CREATE INDEX job_schedule_idx ON rota.job (schedule_id, slot) WHERE schedule_id IS NOT NULL;

-- Recurring schedules; one row per schedule name.
CREATE TABLE rota.schedule (
    id                        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                      text        NOT NULL UNIQUE,
    job_type                  text        NOT NULL,
    cron                      text        NOT NULL,
    timezone                  text        NOT NULL DEFAULT 'UTC',
    payload                   jsonb       NOT NULL DEFAULT '{}'::jsonb,
    next_run_at               timestamptz NOT NULL,
    last_slot                 timestamptz,
    suspend                   boolean     NOT NULL DEFAULT false,
    spread_seconds            integer     NOT NULL DEFAULT 0 CHECK (spread_seconds >= 0),
    concurrency_policy        text        NOT NULL DEFAULT 'Allow'
                              CHECK (concurrency_policy IN ('Allow', 'Forbid')),
    starting_deadline_seconds integer     CHECK (starting_deadline_seconds > 0),
    max_attempts              integer     CHECK (max_attempts >= 1),
    missed_slots              bigint      NOT NULL DEFAULT 0,
    skipped_slots             bigint      NOT NULL DEFAULT 0,
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedule_due_idx ON rota.schedule (next_run_at) WHERE NOT suspend;

-- Lease expirations counted per hour, so `rota status` can show a rate.
CREATE TABLE rota.lease_expiration (
    hour  timestamptz PRIMARY KEY,
    count bigint      NOT NULL DEFAULT 0
);

-- Effect markers: a handler records "this effect of this job happened" in the
-- same transaction as the effect, and a rerun finds the marker.
CREATE TABLE rota.job_effect (
    job_key    text        NOT NULL,
    effect     text        NOT NULL,
    result     jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_key, effect)
);

-- Wake idle workers when a job that can run now is inserted. One NOTIFY per
-- statement (and PostgreSQL folds duplicates within a transaction), delivered
-- at commit, so a batch of thousands costs one notification.
CREATE FUNCTION rota.notify_ready_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE status = 'ready' AND run_at <= now()) THEN
        PERFORM pg_notify('rota_jobs', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_notify_ready
    AFTER INSERT ON rota.job
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rota.notify_ready_jobs();
