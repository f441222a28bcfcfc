-- Moving finished jobs to rota.job_archive, one capped batch per statement so
-- no lock is held for long. SKIP LOCKED steps around rows somebody holds (a
-- `rota dead retry` in flight); their turn comes in a later run. A row is
-- deleted and inserted in the same statement: it is in exactly one table.

-- name: archive_finished
-- Rows of the given statuses finished before the retention; done rows are
-- archived after a shorter retention than failed and dead ones, which somebody
-- may still want to read or retry.
WITH picked AS (
    SELECT id FROM rota.job
    WHERE status = ANY(%(statuses)s::text[])
      AND finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM rota.job AS j USING picked WHERE j.id = picked.id RETURNING j.*
),
archived AS (
    INSERT INTO rota.job_archive (id, type, payload, idempotency_key, status, run_at, attempts,
                                  max_attempts, locked_by, locked_until, last_error, created_at,
                                  started_at, finished_at, schedule_id, slot, priority,
                                  timeout_seconds, cancel_requested_at, releases, group_key,
                                  result, errors, trace_context, parent_id, archived_at)
    SELECT id, type, payload, idempotency_key, status, run_at, attempts, max_attempts,
           locked_by, locked_until, last_error, created_at, started_at, finished_at,
           schedule_id, slot, priority, timeout_seconds, cancel_requested_at, releases,
           group_key, result, errors, trace_context, parent_id,
           coalesce(%(now)s::timestamptz, now())
    FROM moved
    RETURNING 1
)
SELECT count(*) AS moved FROM archived

-- name: delete_archived
-- Archived rows past the archive's own retention, oldest first (through
-- job_archive_archived_idx), deleted in capped batches like the moves. The
-- picked rows are reached by primary key from an array: a join may be planned
-- as a hash join over a scan of the whole archive. A child whose parent is
-- still in rota.job is kept: the parent reads its children's outcomes on every
-- run (a gather), from here once they are archived, and one that ended dead
-- or failed may run again (rota dead retry); the child goes once its parent
-- has left the table.
WITH picked AS (
    SELECT id FROM rota.job_archive AS a
    WHERE archived_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s)
      -- A scalar subquery, so that it stays a look-up of each child's parent
      -- by primary key (NOT EXISTS may be planned as a hash of every job),
      -- asked of children only.
      AND (a.parent_id IS NULL
           OR NOT coalesce((SELECT true FROM rota.job AS p WHERE p.id = a.parent_id), false))
    ORDER BY archived_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM rota.job_archive AS a WHERE a.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING 1
)
SELECT count(*) AS moved FROM deleted

-- name: delete_expired_unique_keys
-- Keys of unique_for (rota.job_unique_key) whose window passed longer ago than
-- the retention, oldest first (job_unique_key_until_idx), in capped batches. An
-- enqueue takes such a key over anyway (enqueue_unique_for: ON CONFLICT DO
-- UPDATE ... WHERE until <= now), so the row refuses nothing; deleting it must
-- still never let the key be taken twice inside a window:
-- - A row an enqueue is taking over right now is locked: SKIP LOCKED passes
--   over it (its new window keeps it), and this statement never waits for an
--   enqueue. An enqueue of a key this statement deletes waits for it to commit,
--   then inserts a new row: a new window, as taking the old row over would be.
-- - A row taken over after this statement's snapshot is locked in its newest
--   version and judged again (READ COMMITTED's recheck): its new window keeps it.
-- - A schedule's key (schedule:<id>) is judged by slot time, not by the clock:
--   a scheduler that comes back late judges its missed slot against the window,
--   so the row stays while the schedule's next slot comes before its end.
-- The retention covers an enqueue whose transaction began inside the window:
-- it judges the key by its transaction's start.
WITH picked AS (
    SELECT k.key FROM rota.job_unique_key AS k
    WHERE k.until < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s)
      -- Written with OR so that it stays a test of each row (not a join that
      -- reads every expired row before the LIMIT), asked of schedule keys only.
      AND (NOT starts_with(k.key, 'schedule:')
           OR NOT EXISTS (SELECT FROM rota.schedule AS s
                          WHERE 'schedule:' || s.id = k.key AND s.next_run_at < k.until))
    ORDER BY k.until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM rota.job_unique_key AS k
    WHERE k.key = ANY(ARRAY(SELECT key FROM picked))
    RETURNING 1
)
SELECT count(*) AS moved FROM deleted

-- name: old_transactions
-- Client transactions of this database older than `quiet` seconds that hold a
-- snapshot or an xid (and prepared ones): while one is open, vacuum may remove
-- no version it might still read, and a rebuild would wait for it and keep what
-- it still sees.
SELECT count(*) AS old FROM (
    SELECT FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND datname = current_database()
      AND backend_type = 'client backend'  -- a vacuum's snapshot holds back nothing
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
      AND xact_start < clock_timestamp() - make_interval(secs => %(quiet)s)
    UNION ALL
    SELECT FROM pg_prepared_xacts WHERE database = current_database()
) AS old

-- name: job_pages
-- rota.job's file in pages; the pages its live rows fill (rows counted by the
-- last vacuum or analyze, their width from the column statistics), however
-- large its file still is; and whether this role owns it (another role's
-- VACUUM only warns that it skips the table).
SELECT pg_relation_size(t.oid) / current_setting('block_size')::int AS file,
       greatest(0, t.reltuples) * (24 + coalesce(sum(s.avg_width), 100))
           / current_setting('block_size')::int AS live,
       pg_has_role(t.relowner, 'MEMBER') AS owned
FROM pg_class AS t
LEFT JOIN pg_stats AS s ON s.schemaname = 'rota' AND s.tablename = 'job'
WHERE t.oid = 'rota.job'::regclass
GROUP BY t.oid, t.reltuples, t.relowner

-- name: bloated_job_indexes
-- The B-tree indexes of rota.job much larger than their entries need: pages
-- past `factor` times what the entries (reltuples, counted by the last
-- vacuum) would take packed, and at least `min_pages`. A long transaction
-- keeps every version of every job alive and each index takes an entry for
-- each; vacuum frees them once it ends, but no index file shrinks (the table's
-- does, from its end). A rebuild reads the table twice, so the pages it gives
-- back must come to `table_share` of `live_pages`, what the table's live rows
-- fill (job_pages), at least. The caller first makes sure no old transaction
-- is open (old_transactions).
WITH indexes AS (
    SELECT c.oid, c.relname, c.reltuples, i.indrelid, i.indkey,
           pg_relation_size(c.oid) / current_setting('block_size')::int AS pages
    FROM pg_index AS i
    JOIN pg_class AS c ON c.oid = i.indexrelid
    JOIN pg_am AS am ON am.oid = c.relam AND am.amname = 'btree'
    WHERE i.indrelid = 'rota.job'::regclass AND i.indisvalid AND i.indisready
)
SELECT x.relname AS name, x.pages, x.reltuples::bigint AS entries, packed.pages AS packed
FROM indexes AS x
CROSS JOIN LATERAL (
    SELECT greatest(1, ceil(x.reltuples * (16 + sum(coalesce(s.avg_width, 8)))
                            / (current_setting('block_size')::int * 0.9)))::bigint AS pages
    FROM unnest(x.indkey::int2[]) AS k(attnum)
    JOIN pg_attribute AS a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
    LEFT JOIN pg_stats AS s
        ON s.schemaname = 'rota' AND s.tablename = 'job' AND s.attname = a.attname
) AS packed
WHERE x.reltuples >= 0
  AND x.pages >= %(min_pages)s
  AND x.pages > %(factor)s * packed.pages
  AND x.pages - packed.pages >= %(table_share)s * %(live_pages)s  -- from job_pages
ORDER BY x.pages DESC

-- name: leftover_job_index_builds
-- Indexes a rebuild interrupted left behind (REINDEX CONCURRENTLY names its new
-- index *_ccnew and drops the old one as *_ccold): invalid, never used, still
-- written by every insert.
SELECT c.relname AS name
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = 'rota.job'::regclass AND NOT i.indisvalid
  AND c.relname ~ '_cc(new|old)[0-9]*$'
