-- Failed attempts counted per minute and job type, for the console's
-- "failed attempts per minute" chart and its overview.
--
-- An attempt failed when its outcome appended an error to the job's error
-- history (rota.errors_with, migration 0009): a retry, a permanent failure, a
-- last attempt that left the job dead, a timeout, a lease that expired. Not a
-- release (a worker shutting down or an outage gives the job back without
-- counting the attempt: releases grow) and not a cancellation.
--
-- The count is kept by a row trigger whose WHEN clause is evaluated in the
-- executor: an outcome that appends no error (every done job) calls no
-- function. Counts are appended, one row per failed attempt, as the done counts
-- are (migration 0016), so a burst of failures of one type never queues on one
-- row; the queue's minute sample folds the last hour's rows into one row per
-- minute and type (rota.fold_failure_counts) and prunes what the charts no
-- longer show. Both functions run as the schema's owner, so a role granted
-- only what a worker needs counts and folds without a grant on this table.
CREATE TABLE rota.job_failure_count (
    minute timestamptz NOT NULL,
    type text NOT NULL,
    count bigint NOT NULL
);
CREATE INDEX job_failure_count_minute_idx ON rota.job_failure_count (minute);

CREATE FUNCTION rota.job_failure_counted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The minute of the failure as the outcome wrote it (a frozen clock in tests).
    INSERT INTO rota.job_failure_count (minute, type, count)
    VALUES (date_trunc('minute', coalesce((NEW.errors -> -1 ->> 'at')::timestamptz, now())),
            NEW.type, 1);
    RETURN NULL;
END
$$;

CREATE TRIGGER job_failure_counted
AFTER UPDATE OF errors ON rota.job
FOR EACH ROW
WHEN (NEW.errors IS NOT NULL AND NEW.errors IS DISTINCT FROM OLD.errors
      AND NEW.releases <= OLD.releases AND NEW.status <> 'cancelled')
EXECUTE FUNCTION rota.job_failure_counted();

-- Fold the rows of the hour before `before` into one per minute and type, and
-- drop those older than `keep_since`; the rows folded. As the schema's owner
-- too: whoever writes the minute's sample folds, whatever its grants.
CREATE FUNCTION rota.fold_failure_counts(before timestamptz, keep_since timestamptz)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM rota.job_failure_count WHERE minute < keep_since
    ),
    gone AS (
        DELETE FROM rota.job_failure_count
        WHERE minute < before AND minute >= before - interval '1 hour'
        RETURNING minute, type, count
    ),
    folded AS (
        INSERT INTO rota.job_failure_count (minute, type, count)
        SELECT minute, type, sum(count) FROM gone GROUP BY minute, type
    )
    SELECT count(*) FROM gone
$$;
