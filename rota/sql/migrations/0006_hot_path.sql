-- What a job costs the database: fewer index entries and no trigger on the
-- statements every job goes through (claim, heartbeat, outcome).

-- Done counts. An AFTER UPDATE trigger with transition tables made every
-- claim, heartbeat and outcome statement keep a copy of each row it touched,
-- before and after, and join the two: a fifth of the server's CPU per job.
-- The one statement that moves a job into done, write_outcomes, now counts
-- what it moved in the same statement. Inserts and deletes keep their
-- triggers (enqueueing done rows by hand, archiving). Rows set to done by a
-- hand-written UPDATE are not counted: rota.recount_done_jobs() counts again.
DROP TRIGGER job_done_count_update ON rota.job;
DROP FUNCTION rota.job_done_count_updated();

-- Rebuild the done counts from the table (one scan of the done rows). The
-- lock keeps writers of done rows out until the new counts are in.
CREATE FUNCTION rota.recount_done_jobs() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    total bigint;
BEGIN
    -- In the order write_outcomes takes them (the job, then the counts).
    LOCK TABLE rota.job IN SHARE ROW EXCLUSIVE MODE;
    LOCK TABLE rota.job_done_count IN EXCLUSIVE MODE;
    DELETE FROM rota.job_done_count;
    INSERT INTO rota.job_done_count (type, shard, count)
    SELECT type, 0, count(*) FROM rota.job WHERE status = 'done' GROUP BY type;
    SELECT coalesce(sum(count), 0) INTO total FROM rota.job_done_count;
    RETURN total;
END
$$;

-- A worker's running rows are found among the running rows (never more than
-- the workers' concurrency) through job_running_idx; an index of their own cost
-- one entry per claim.
DROP INDEX rota.job_running_worker_idx;
