-- What the web console (`rota web`) reads beyond the job table: the workers
-- that are alive, a minute-by-minute sample of the queue for its charts, and
-- the record of every action taken through it.

-- One row per running worker. A worker inserts its row when it starts,
-- refreshes it on every heartbeat (pushing expires_at forward) and deletes it
-- when it stops; a worker killed outright leaves a row that expires, and
-- expired rows are deleted by the next worker that refreshes its own.
CREATE TABLE rota.worker (
    id          text        PRIMARY KEY,
    host        text        NOT NULL DEFAULT '',
    pid         integer,
    concurrency integer     NOT NULL CHECK (concurrency >= 1),
    types       text[]      NOT NULL DEFAULT '{}',
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX worker_expires_idx ON rota.worker (expires_at);

-- The queue once a minute, for the console's charts: the totals it keeps
-- anyway (done counts from rota.job_done_count, ended counts and ready ages
-- from partial indexes), written by whichever worker or console gets to the
-- minute first. Charts read the last hour of these rows, never rota.job.
CREATE TABLE rota.queue_sample (
    minute                   timestamptz PRIMARY KEY,
    done_total               bigint      NOT NULL,
    ended_total              bigint      NOT NULL,
    ready_due                bigint      NOT NULL,
    running                  bigint      NOT NULL,
    oldest_ready_age_seconds double precision NOT NULL
);

-- Who did what through the console: one row per action, written in the same
-- transaction as the change it records.
CREATE TABLE rota.audit (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now(),
    actor  text        NOT NULL,
    role   text        NOT NULL,
    action text        NOT NULL,
    target jsonb       NOT NULL DEFAULT '{}'::jsonb,
    rows   integer     NOT NULL DEFAULT 0
);

-- What a worker runs now: its running rows, found by locked_by among the
-- running rows only.
CREATE INDEX job_running_worker_idx ON rota.job (locked_by) WHERE status = 'running';
