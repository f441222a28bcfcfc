-- The archiver deletes the rows of rota.job_unique_key whose unique_for window
-- has passed (rota/sql/archive.sql, delete_expired_unique_keys), oldest window
-- first and in capped batches: through this index each batch reads the rows it
-- deletes, not the whole table. A key taken over moves its row in the index
-- (one more index entry per window, not per enqueue refused inside one).
CREATE INDEX job_unique_key_until_idx ON rota.job_unique_key (until);
