-- An archived job keeps the job that spawned it.
--
-- rota.job_archive had no parent_id: once the archiver moved a durable job's
-- child, `rota jobs show` and the console's job page no longer said which job
-- had spawned it (its parent's page still listed it, by name and id). The
-- archive now keeps the column; jobs archived before stay without it.

ALTER TABLE rota.job_archive ADD COLUMN parent_id bigint;
