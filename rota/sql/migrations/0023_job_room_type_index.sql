-- Less written per job: 30 % of each page of rota.job kept free, and no entry
-- in the type index for a running version.
--
-- A job's claim and its outcome each write a new version of its row, and
-- each version that lands on another page writes more WAL than one that stays
-- (a lock record first, the whole new row instead of what changed). Jobs
-- enqueued together fill their pages; with a tenth of each page free
-- (migration 0022) most versions of a batch claimed together moved. Half of
-- each page free wrote the least on an empty table but five times as much
-- beside 2,000,000 done rows (new jobs went one to a page among them);
-- 30 % was the best of both (bench/JOURNAL.md).
--
-- `job_type_idx` (`jobs list --type`, migration 0008) took an entry for every
-- version of every job, 220 WAL bytes a job in a drain. The running jobs of a
-- type are found among the running rows (job_running_idx) instead, so the
-- claim, the most frequent write, enters nothing here (list_jobs reads both).
-- Building the index blocks writes to rota.job while it runs: seconds on a
-- table of millions of rows.

ALTER TABLE rota.job SET (fillfactor = 70);

DROP INDEX rota.job_type_idx;
CREATE INDEX job_type_idx ON rota.job (type, id) WHERE status <> 'running';
