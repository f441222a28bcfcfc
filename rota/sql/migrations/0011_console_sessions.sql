-- The console's login sessions and per-type samples.

-- The console's login sessions, kept on the server so that logging out ends a
-- session everywhere at once: a session cookie is signed and names one row
-- here (by a hash of its nonce); a cookie whose row is gone is no login.
-- Rows past expires_at are deleted by the next login.
CREATE TABLE rota.web_session (
    id         text        PRIMARY KEY,
    actor      text        NOT NULL,
    role       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX web_session_expires_idx ON rota.web_session (expires_at);

-- The queue once a minute per job type, beside rota.queue_sample, for the
-- console's per-type charts: written with the queue's sample, kept eight days.
CREATE TABLE rota.queue_sample_type (
    minute      timestamptz NOT NULL,
    type        text        NOT NULL,
    done_total  bigint      NOT NULL,
    ended_total bigint      NOT NULL,
    ready_due   bigint      NOT NULL,
    running     bigint      NOT NULL,
    PRIMARY KEY (minute, type)
);
