-- Limit slots, settled once per change of the limit instead of checked by
-- every claim.
--
-- Before, every claim of a slot limit first counted every running job of its
-- type to be sure they all fit their slots (a job running without a slot, or
-- a slot over its share, sends the claim down the path of one row). On
-- statistics taken while nothing ran, that count was planned as a bitmap of
-- every version of the type's rows, or as a scan of the whole table in the
-- path of one row: the claims' reads grew with the jobs run since the last
-- vacuum, and with the table.
--
-- Now a limit is settled: every running job of its type sits in a slot within
-- its share, and no claim that might not have seen the limit is still in
-- flight. Until then claims take the path of one row, which settles it when
-- it can; once settled, claims take the slots without a count of the whole
-- type. A change of the limit unsettles it. The claim that reads the flag is
-- rota.pick_limited (migration 0021); this one adds the flag, the fence and
-- the functions that settle.
--
-- Why "no claim in flight" is needed: a claim whose snapshot was taken before
-- the limit was committed does not see the limit and starts jobs of its type
-- without a slot, possibly after the running jobs were counted. Every claim
-- holds a lock on rota.job_limit from before its snapshot until it commits.
-- After the limit is committed, the transactions holding such a lock are
-- noted (the limit's fence); once none of them holds it any more, every claim
-- that did not see the limit has committed, and a count made after that sees
-- its jobs. A claim that takes the lock later takes its snapshot later still,
-- and sees the limit.

ALTER TABLE rota.job_limit
    ADD COLUMN slots_settled boolean NOT NULL DEFAULT false,
    -- The transactions (pg_locks.virtualtransaction) that held a lock on
    -- rota.job_limit when the limit was first looked at after its last change;
    -- NULL until then.
    ADD COLUMN slots_fence text[];

CREATE FUNCTION rota.job_limit_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR (NEW.concurrency, NEW.group_concurrency, NEW.rate, NEW.per_seconds)
          IS DISTINCT FROM (OLD.concurrency, OLD.group_concurrency, OLD.rate, OLD.per_seconds)
    THEN
        NEW.slots_settled := false;
        NEW.slots_fence := NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER job_limit_unsettled
    BEFORE INSERT OR UPDATE OF concurrency, group_concurrency, rate, per_seconds
    ON rota.job_limit
    FOR EACH ROW EXECUTE FUNCTION rota.job_limit_changed();

-- A slot removed by hand unsettles its limit.
CREATE FUNCTION rota.job_limit_slot_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rota.job_limit AS l SET slots_settled = false, slots_fence = NULL
    WHERE l.type = OLD.type AND l.slots_settled;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_limit_slot_removed
    AFTER DELETE ON rota.job_limit_slot
    FOR EACH ROW EXECUTE FUNCTION rota.job_limit_slot_removed();

-- The running jobs of a type, counted by slot and group. Driven from
-- job_running_idx whatever the statistics say (no scan but an index's, and
-- the type compared in a form no index serves): a plan made on statistics
-- taken while nothing ran would otherwise read every version of the type's
-- rows (job_type_idx) or the whole table, on every claim of a limit.
CREATE FUNCTION rota.running_of_type(job_type text)
RETURNS TABLE (limit_slot smallint, group_key text, n bigint)
LANGUAGE sql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
    SELECT j.limit_slot, j.group_key, count(*)
    FROM rota.job AS j
    WHERE j.status = 'running' AND (j.type = job_type) IS TRUE
    GROUP BY j.limit_slot, j.group_key
$$;

-- Settle the limit of `job_type` if it can be: the caller holds the limit's
-- row and every one of its slots locked (so no other claim of the limit runs),
-- in READ COMMITTED (each statement below sees a new snapshot). True when the
-- limit is settled.
CREATE FUNCTION rota.settle_slots(job_type text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    lim rota.job_limit;
    holders text[];
    fits boolean;
BEGIN
    SELECT l.* INTO lim FROM rota.job_limit AS l WHERE l.type = job_type;
    IF NOT FOUND OR lim.concurrency IS NULL OR lim.group_concurrency IS NOT NULL
       OR lim.rate IS NOT NULL THEN
        RETURN false;
    END IF;
    IF lim.slots_settled THEN
        RETURN true;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN false;
    END IF;
    holders := ARRAY(
        SELECT DISTINCT k.virtualtransaction FROM pg_locks AS k
        WHERE k.locktype = 'relation'
          AND k.relation = 'rota.job_limit'::regclass
          AND k.database = (SELECT d.oid FROM pg_database AS d
                            WHERE d.datname = current_database())
          AND k.pid IS DISTINCT FROM pg_backend_pid());
    IF lim.slots_fence IS NOT NULL THEN
        holders := ARRAY(SELECT h FROM unnest(lim.slots_fence) AS h WHERE h = ANY(holders));
    END IF;
    IF cardinality(holders) > 0 THEN
        UPDATE rota.job_limit AS l SET slots_fence = holders WHERE l.type = job_type;
        RETURN false;
    END IF;
    -- Every claim that might not have seen the limit has ended: count.
    SELECT coalesce(bool_and(r.limit_slot IS NOT NULL
                             AND r.n <= rota.limit_share(lim.concurrency, r.limit_slot)), true)
    INTO fits
    FROM (SELECT c.limit_slot, sum(c.n) AS n FROM rota.running_of_type(job_type) AS c
          GROUP BY c.limit_slot) AS r;
    fits := fits AND (SELECT count(*) FROM rota.job_limit_slot AS ls
                      WHERE ls.type = job_type) = rota.limit_slots();
    UPDATE rota.job_limit AS l SET slots_settled = fits, slots_fence = '{}'
    WHERE l.type = job_type;
    RETURN fits;
END
$$;

-- Settle a limit just set (rota.set_limit, after it committed the limit),
-- waiting for the claims of its slots in flight.
CREATE FUNCTION rota.settle_limit(job_type text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM rota.job_limit AS l WHERE l.type = job_type FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM FROM rota.job_limit_slot AS ls WHERE ls.type = job_type ORDER BY ls.slot FOR UPDATE;
    RETURN rota.settle_slots(job_type);
END
$$;
