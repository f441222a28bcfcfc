-- Unique jobs on schedules: a schedule's slots share one key, `schedule:<id>`,
-- beside each slot's own idempotency key `schedule:<id>:<slot>`.

ALTER TABLE rota.schedule
    -- A slot makes a job only when this many seconds have passed since the slot
    -- of the schedule's last job (NULL: every slot makes one).
    ADD COLUMN unique_for_seconds double precision CHECK (unique_for_seconds > 0),
    -- A slot makes no job while a job of the schedule is ready or running.
    ADD COLUMN unique_active boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT schedule_unique_one_kind CHECK (NOT (unique_active AND unique_for_seconds IS NOT NULL));
