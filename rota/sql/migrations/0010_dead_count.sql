-- Jobs that ever went dead, counted per type: the counter behind
-- rota_jobs_dead_total. The number of dead rows (rota_jobs{status="dead"})
-- goes down when somebody runs `rota dead retry` or archives them, so growth of
-- the dead-letter list cannot be read from it; this count only ever grows.
--
-- Row-level triggers with a WHEN clause: the condition is checked in the
-- executor for every inserted or updated row, and the function runs only for
-- the rare row that enters dead, so the hot path (claims, completions) pays a
-- comparison per row and no upsert. Shards spread concurrent deaths of one
-- type over 16 rows, as rota.job_done_count does.
CREATE TABLE rota.job_dead_count (
    type  text    NOT NULL,
    shard integer NOT NULL,
    count bigint  NOT NULL,
    PRIMARY KEY (type, shard)
);

CREATE FUNCTION rota.job_dead_count_entered() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rota.job_dead_count (type, shard, count)
    VALUES (NEW.type, mod(pg_backend_pid(), 16), 1)
    ON CONFLICT (type, shard) DO UPDATE SET count = rota.job_dead_count.count + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_dead_count_insert
    AFTER INSERT ON rota.job
    FOR EACH ROW WHEN (NEW.status = 'dead')
    EXECUTE FUNCTION rota.job_dead_count_entered();

CREATE TRIGGER job_dead_count_update
    AFTER UPDATE OF status ON rota.job
    FOR EACH ROW WHEN (NEW.status = 'dead' AND OLD.status <> 'dead')
    EXECUTE FUNCTION rota.job_dead_count_entered();

-- Dead rows that exist already count as deaths seen before the counter began.
INSERT INTO rota.job_dead_count (type, shard, count)
SELECT type, 0, count(*) FROM rota.job WHERE status = 'dead' GROUP BY type;
