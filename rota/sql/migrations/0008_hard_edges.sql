-- Hard edges: effect markers that go with their job, and an index that lets
-- the CLI find the jobs of one type without reading the table.

-- An effect marker belongs to its job's effect key (the idempotency key, or
-- 'rota-job:<id>' for a job without one). Once the job leaves rota.job
-- (archived, or deleted by hand) its key may be used again, and the new job
-- must run its effects: the markers go in the same statement as the job.
CREATE FUNCTION rota.forget_job_effects() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM rota.job_effect AS e
    USING old_rows AS o
    WHERE e.job_key = coalesce(o.idempotency_key, 'rota-job:' || o.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER job_forget_effects
    AFTER DELETE ON rota.job
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rota.forget_job_effects();

-- Markers left behind by jobs archived before this migration.
DELETE FROM rota.job_effect AS e
WHERE NOT EXISTS (SELECT FROM rota.job AS j WHERE j.idempotency_key = e.job_key)
  AND NOT (e.job_key ~ '^rota-job:[0-9]{1,18}$'
           AND EXISTS (SELECT FROM rota.job AS j
                       WHERE j.id = substr(e.job_key, 10)::bigint));

-- The jobs of one type, newest first (`rota jobs list --type`), through an
-- index instead of every row: a rare type is found at once.
CREATE INDEX job_type_idx ON rota.job (type, id);
