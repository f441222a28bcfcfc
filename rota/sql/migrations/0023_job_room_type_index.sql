-- Less written per job: half of each page of rota.job kept free, and no entry
-- in the type index for a running version.
--
-- A job's claim and its outcome each write a new version of its row, and
-- each version that lands on another page writes more WAL than one that stays
-- (a lock record first, the whole new row instead of what changed). Jobs
-- enqueued together fill their pages; with a tenth of each page free
-- (migration 0022) most versions of a batch claimed together moved, with half
-- almost none do: a drain wrote 1,250 WAL bytes a job instead of 1,394.
--
-- `job_type_idx` (`jobs list --type`, migration 0008) took an entry for every
-- version of every job, 220 WAL bytes a job in a drain. The running jobs of a
-- type are found among the running rows (job_running_idx) instead, so the
-- claim, the most frequent write, enters nothing here (list_jobs reads both).
-- Building the index blocks writes to rota.job while it runs: seconds on a
-- table of millions of rows.

ALTER TABLE rota.job SET (fillfactor = 50);

DROP INDEX rota.job_type_idx;
CREATE INDEX job_type_idx ON rota.job (type, id) WHERE status <> 'running';
