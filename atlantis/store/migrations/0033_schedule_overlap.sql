-- Schedules for long jobs (issue 37): a scheduled job's `overlap`, an operator's switch per
-- schedule, and the slots skipped counted apart from the missed ones. Additive: a supervisor
-- one release behind calls atlantis.schedule_catch_up as before, whose live body now follows
-- the stored `overlap` and the switch (live/schedules.sql).

-- What a slot does while an earlier run of the schedule is waiting or running: 'skip' (no
-- job; the default) or 'allow' (a job for every slot, as 0.2 did). NULL: synced by a release
-- that knows no overlap (or a job with no schedule), read as 'skip'.
ALTER TABLE atlantis.job_types ADD COLUMN overlap text;

-- One row per schedule, made by the first slot fired or the first switch flipped: the row
-- every firing transaction locks, the operator's switch, the slots skipped.
CREATE TABLE atlantis.schedules (
    job text PRIMARY KEY,
    -- tide schedule disable|enable NAME, the console: no slot fires while false.
    enabled boolean NOT NULL DEFAULT true,
    -- Who flipped the switch last, and when.
    changed_by text,
    changed_at timestamptz,
    -- When it was last enabled again: the slots up to it are neither run nor counted missed.
    enabled_from timestamptz,
    -- Slots skipped by overlap 'skip', in all, and the latest of them.
    skipped bigint NOT NULL DEFAULT 0,
    last_skipped timestamptz,
    -- The earliest slot whose run may still be waiting or running: where 'skip' looks from.
    open_from timestamptz
);

-- The latest slot a schedule dealt with (enqueued, missed or skipped) or the moment it was
-- enabled again, whichever is later: where its next round goes on from.
CREATE FUNCTION atlantis.schedule_cursor(job_name text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$ SELECT NULL::timestamptz $$;

-- The schedule's row, made if need be, locked for the caller's transaction.
CREATE FUNCTION atlantis.schedule_lock(job_name text) RETURNS atlantis.schedules
LANGUAGE sql AS $$ SELECT NULL::atlantis.schedules $$;

-- The run of the schedule still waiting or running that started the earliest, if any.
CREATE FUNCTION atlantis.schedule_open_run(job_name text, since timestamptz,
                                           OUT slot timestamptz, OUT job_id bigint)
LANGUAGE sql STABLE AS $$ SELECT NULL::timestamptz, NULL::bigint $$;

-- schedule_catch_up's successor: the same slots, and the schedule's overlap.
CREATE FUNCTION atlantis.schedule_advance(job_name text, after timestamptz,
                                          missed_from timestamptz, missed_to timestamptz,
                                          missed bigint, due timestamptz[], overlap text,
                                          OUT outcome text, OUT last_slot timestamptz,
                                          OUT job_ids bigint[], OUT job_slots timestamptz[],
                                          OUT skipped bigint, OUT open_job bigint)
LANGUAGE sql AS $$ SELECT NULL::text, NULL::timestamptz, NULL::bigint[], NULL::timestamptz[],
                          NULL::bigint, NULL::bigint $$;

-- The operator's switch.
CREATE FUNCTION atlantis.schedule_set_enabled(job_name text, enabled boolean,
                                              by text DEFAULT current_user) RETURNS boolean
LANGUAGE sql AS $$ SELECT NULL::boolean $$;
