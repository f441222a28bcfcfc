-- The oldest due ready job's age per job type in the console's per-type sample,
-- for the queue-age chart's line per type. NULL in the samples written before
-- (a gap in those lines), never a made-up 0.
ALTER TABLE rota.queue_sample_type ADD COLUMN oldest_ready_age_seconds double precision;
