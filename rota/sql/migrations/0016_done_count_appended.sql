-- Done counts appended, folded once a minute.
--
-- Each outcome statement (rota/sql/queries.sql, write_outcomes) and the
-- insert and delete triggers of 0003 added their counts to one row per
-- (type, shard) with an upsert. Every such update makes a new version of the
-- row, and while a transaction is held open anywhere in the database none of
-- them can be removed: the next update of the row walks all the versions made
-- since (an outcome statement of 3.6 ms took 16 ms after three minutes at
-- 1,000 jobs/s). Counts are now appended, a row per statement and type, which
-- costs the same however long a transaction is held; rota.fold_done_counts()
-- folds them into one row per type, from the queue's minute sample. Readers
-- sum the rows of a type, as they summed the shards.
--
-- An appended row takes a shard of its own from a sequence (16 and up), so the
-- primary key stays: a 0.2 worker still running during an upgrade upserts its
-- shard 0-15 rows with ON CONFLICT (type, shard), which needs it.
CREATE SEQUENCE rota.job_done_count_shard AS integer MINVALUE 16 CYCLE;
ALTER TABLE rota.job_done_count
    ALTER COLUMN shard SET DEFAULT nextval('rota.job_done_count_shard');

CREATE OR REPLACE FUNCTION rota.job_done_count_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.job_done_count (type, count)
    SELECT type, CASE TG_OP WHEN 'INSERT' THEN count(*) ELSE -count(*) END
    FROM changed_rows
    WHERE status = 'done'
    GROUP BY type;
    RETURN NULL;
END
$$;

-- Fold the appended counts into one row per type; the rows folded. A row
-- appended meanwhile is not in the DELETE's snapshot and stays for the next
-- fold; two folds at once each fold only the rows their DELETE removed.
CREATE FUNCTION rota.fold_done_counts() RETURNS bigint
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM rota.job_done_count RETURNING type, count
    ),
    folded AS (
        INSERT INTO rota.job_done_count (type, count)
        SELECT type, sum(count) FROM gone GROUP BY type HAVING sum(count) <> 0
    )
    SELECT count(*) FROM gone
$$;

SELECT rota.fold_done_counts();
