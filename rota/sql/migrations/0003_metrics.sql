-- Support for cheap metrics (rota.metrics): nothing here may make a scrape read
-- every row of rota.job.

-- Done rows per type, kept by triggers, because counting millions of done rows
-- on every scrape is exactly the full scan the metrics must never need. Ready,
-- running, failed and dead rows are few and are counted exactly through their
-- partial indexes instead. Each type has up to 16 shard rows (chosen by the
-- backend's pid) so workers finishing jobs of one type at once do not queue on
-- one counter row; a reader sums the shards.
CREATE TABLE rota.job_done_count (
    type  text    NOT NULL,
    shard integer NOT NULL,
    count bigint  NOT NULL,
    PRIMARY KEY (type, shard)
);

-- Statement level with transition tables: one upsert per type and statement,
-- however many rows the statement moves (a batch of 500 completions is one
-- upsert, not 500). Row-level triggers here cost about a third of the drain
-- throughput, measured with the benchmark.
--
-- Inserted rows count +1, deleted rows (archiving, in large batches) -1; the
-- triggers below name either transition table `changed_rows`.
CREATE FUNCTION rota.job_done_count_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.job_done_count (type, shard, count)
    SELECT type, mod(pg_backend_pid(), 16),
           CASE TG_OP WHEN 'INSERT' THEN count(*) ELSE -count(*) END
    FROM changed_rows
    WHERE status = 'done'
    GROUP BY type
    ON CONFLICT (type, shard) DO UPDATE SET count = rota.job_done_count.count + excluded.count;
    RETURN NULL;
END
$$;

-- Updated rows count +1 entering done, -1 leaving it.
CREATE FUNCTION rota.job_done_count_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.job_done_count (type, shard, count)
    SELECT type, mod(pg_backend_pid(), 16), sum(delta)
    FROM (
        SELECT n.type, 1 AS delta
        FROM new_rows n JOIN old_rows o USING (id)
        WHERE n.status = 'done' AND (o.status <> 'done' OR o.type <> n.type)
        UNION ALL
        SELECT o.type, -1
        FROM old_rows o JOIN new_rows n USING (id)
        WHERE o.status = 'done' AND (n.status <> 'done' OR o.type <> n.type)
    ) AS moved
    GROUP BY type
    ON CONFLICT (type, shard) DO UPDATE SET count = rota.job_done_count.count + excluded.count;
    RETURN NULL;
END
$$;

CREATE FUNCTION rota.job_done_count_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM rota.job_done_count;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_done_count_insert
    AFTER INSERT ON rota.job
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rota.job_done_count_changed();

CREATE TRIGGER job_done_count_update
    AFTER UPDATE ON rota.job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rota.job_done_count_updated();

CREATE TRIGGER job_done_count_delete
    AFTER DELETE ON rota.job
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rota.job_done_count_changed();

CREATE TRIGGER job_done_count_truncate
    AFTER TRUNCATE ON rota.job
    FOR EACH STATEMENT EXECUTE FUNCTION rota.job_done_count_truncated();

-- Done rows that exist already. The triggers above hold a lock on rota.job
-- until this transaction commits, so no row is counted twice or missed.
INSERT INTO rota.job_done_count (type, shard, count)
SELECT type, 0, count(*) FROM rota.job WHERE status = 'done' GROUP BY type;

-- Failed and dead rows per type from the index alone (index-only scans);
-- the rows are few and rarely written, so the index costs next to nothing.
CREATE INDEX job_failed_type_idx ON rota.job (status, type) WHERE status IN ('failed', 'dead');
