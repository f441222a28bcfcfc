-- Finished jobs moved out of rota.job by the archiver (rota.archive). Same
-- columns as rota.job, no constraints beyond the key: the rows are history,
-- and an idempotency key found only here may be used again by a new job.
CREATE TABLE rota.job_archive (
    id              bigint      PRIMARY KEY,
    type            text        NOT NULL,
    payload         jsonb       NOT NULL,
    idempotency_key text,
    status          text        NOT NULL,
    run_at          timestamptz NOT NULL,
    attempts        integer     NOT NULL,
    max_attempts    integer     NOT NULL,
    locked_by       text,
    locked_until    timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz,
    schedule_id     bigint,
    slot            timestamptz,
    archived_at     timestamptz NOT NULL DEFAULT now()
);
-- Looking up what happened to a key or a schedule's slots after archiving.
CREATE INDEX job_archive_key_idx ON rota.job_archive (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX job_archive_archived_idx ON rota.job_archive (archived_at);

-- The built-in schedule that runs the archiver, on by default. Operators
-- change it like any schedule (`rota schedule add rota/archive ...` with new
-- settings in the payload, or `rota schedule suspend rota/archive`). Its
-- next_run_at is the first slot of '*/5 * * * *' after now.
INSERT INTO rota.schedule (name, job_type, cron, timezone, payload, next_run_at,
                           concurrency_policy, max_attempts)
VALUES ('rota/archive', 'rota.archive', '*/5 * * * *', 'UTC', '{}'::jsonb,
        date_trunc('hour', now())
            + make_interval(mins => (extract(minute FROM now())::int / 5 + 1) * 5),
        'Forbid', 3);
