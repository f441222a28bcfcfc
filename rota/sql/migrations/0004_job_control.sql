-- Job control: priorities, per-job timeouts, cancellation and paused job types.

-- A cancelled job is terminal, like failed: never retried, archived like failed.
ALTER TABLE rota.job DROP CONSTRAINT job_status_check;
ALTER TABLE rota.job ADD CONSTRAINT job_status_check
    CHECK (status IN ('ready', 'running', 'done', 'failed', 'dead', 'cancelled'));

ALTER TABLE rota.job
    -- 0 runs first (the most urgent), 9 last; strict: a claim takes every due
    -- job of a more urgent priority before any of a less urgent one.
    ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    -- Seconds an attempt may run before the worker stops it; NULL: no limit.
    ADD COLUMN timeout_seconds double precision CHECK (timeout_seconds > 0),
    -- Set when somebody asked to cancel a running job; its worker learns it
    -- from its next heartbeat.
    ADD COLUMN cancel_requested_at timestamptz,
    -- Consecutive times the job was given back without counting the attempt
    -- (its handler lost the database, or its worker shut down). Such give-backs
    -- wait longer each time, and past a limit count as attempts, so a job whose
    -- handler always loses its connection cannot loop for ever.
    ADD COLUMN releases integer NOT NULL DEFAULT 0;

ALTER TABLE rota.job_archive
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN timeout_seconds double precision,
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN releases integer NOT NULL DEFAULT 0;

-- Claiming walks one priority at a time, oldest run_at first, and stops at the
-- first job not yet due: future jobs of a priority are never read.
CREATE INDEX job_claim_idx ON rota.job (priority, run_at, id) WHERE status = 'ready';
DROP INDEX rota.job_ready_idx;

-- Failed, dead and cancelled rows: counted by type, listed, archived.
CREATE INDEX job_ended_type_idx ON rota.job (status, type)
    WHERE status IN ('failed', 'dead', 'cancelled');
DROP INDEX rota.job_failed_type_idx;
CREATE INDEX job_ended_idx ON rota.job (status, finished_at)
    WHERE status IN ('failed', 'dead', 'cancelled');
DROP INDEX rota.job_failed_idx;
CREATE INDEX job_terminal_idx ON rota.job (finished_at)
    WHERE status IN ('done', 'failed', 'dead', 'cancelled');
DROP INDEX rota.job_finished_idx;

-- Scheduled jobs inherit the schedule's priority and timeout.
ALTER TABLE rota.schedule
    ADD COLUMN priority smallint CHECK (priority BETWEEN 0 AND 9),
    ADD COLUMN timeout_seconds double precision CHECK (timeout_seconds > 0);

-- Job types whose jobs no worker claims; the type '*' pauses every type.
-- Lives in the database, so a pause survives restarts of every process.
CREATE TABLE rota.paused_type (
    type      text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
