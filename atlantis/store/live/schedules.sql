-- ---- Schedules --------------------------------------------------------------------------

-- Where a schedule stands (migration 0033). Every firing holds two locks: the advisory lock
-- of the earlier releases' bodies (one firing per schedule at a time, not waited for by
-- schedule_catch_up and schedule_advance) and the row of atlantis.schedules (made on demand),
-- which atlantis.schedule_set_enabled locks too: a switch flipped waits for a firing under
-- way, and the firing after it sees the switch. The checks of a firing (the latest slot, the
-- switch, a run still open) are made once both are held, so two supervisors firing
-- consecutive slots cannot both miss the other's run.

-- The latest slot a schedule dealt with (enqueued, or counted missed or skipped) or the moment
-- it was enabled again, whichever is later: where its next round goes on from. NULL: never.
CREATE OR REPLACE FUNCTION atlantis.schedule_cursor(job_name text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT greatest((SELECT max(r.slot) FROM atlantis.schedule_runs r WHERE r.job = job_name),
                    (SELECT greatest(s.last_skipped, s.enabled_from)
                       FROM atlantis.schedules s WHERE s.job = job_name))
$$;

-- The schedule's row, made if it has none yet (INSERT ... ON CONFLICT: two first firings
-- make one), locked until the caller's transaction ends.
CREATE OR REPLACE FUNCTION atlantis.schedule_lock(job_name text) RETURNS atlantis.schedules
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held atlantis.schedules;
BEGIN
    SELECT * INTO held FROM atlantis.schedules s WHERE s.job = job_name FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO atlantis.schedules AS s (job) VALUES (job_name) ON CONFLICT (job) DO NOTHING;
        SELECT * INTO held FROM atlantis.schedules s WHERE s.job = job_name FOR UPDATE;
    END IF;
    RETURN held;
END
$$;

-- The earliest run of the schedule, from the slot `since` on (NULL: all it keeps), that is
-- still waiting (due or not: a retry's wait, a durable sleep or wait: state `available`) or
-- running; NULLs when none is. `since` is atlantis.schedules.open_from: the runs before it
-- were seen ended, so a check reads a run or two, not every run retention keeps.
CREATE OR REPLACE FUNCTION atlantis.schedule_open_run(job_name text, since timestamptz,
                                                      OUT slot timestamptz, OUT job_id bigint)
LANGUAGE sql STABLE AS $$
    SELECT r.slot, r.job_id
      FROM atlantis.schedule_runs r
      JOIN atlantis.jobs j ON j.id = r.job_id
     WHERE r.job = job_name AND r.slot >= coalesce(since, '-infinity'::timestamptz)
       AND j.state IN ('available', 'running')
     ORDER BY r.slot
     LIMIT 1
$$;

-- Every slot of one schedule since the latest it dealt with, in one transaction (the current
-- supervisors' call; the earlier releases' call atlantis.schedule_catch_up, below). The caller
-- (the supervisors' scheduler, which does the cron arithmetic) read `after`, the schedule's
-- atlantis.schedule_cursor (NULL if none), and passes what follows it up to the database's
-- clock: `missed` slots from `missed_from` to `missed_to`, past the grace, and `due`, the
-- slots within the grace, in order; `overlap` is the job's declaration ('allow', else 'skip').
-- `outcome`:
-- - 'busy': another firing of the schedule holds its lock (not waited for: a supervisor
--   stopped inside this function holds up no other); nothing is done.
-- - 'disabled': an operator switched it off; nothing is done or counted.
-- - 'stale': `after` is no longer its cursor (another supervisor was first, or it was enabled
--   again); nothing is done, and `last_slot` is the cursor to compute again from.
-- - 'done': the missed slots are one row (none when the schedule never ran: a new schedule
--   does not count its past as missed), then each due slot a row and a job with the default
--   args (`job_ids`, at `job_slots`), except, with 'skip', while a run of the schedule is still
--   waiting or running (`open_job`, the earliest; a job enqueued here is one): such a slot is
--   only counted, in `skipped` and atlantis.schedules. `last_slot` is the new cursor.
CREATE OR REPLACE FUNCTION atlantis.schedule_advance(job_name text, after timestamptz,
                                          missed_from timestamptz, missed_to timestamptz,
                                          missed bigint, due timestamptz[], overlap text,
                                          OUT outcome text, OUT last_slot timestamptz,
                                          OUT job_ids bigint[], OUT job_slots timestamptz[],
                                          OUT skipped bigint, OUT open_job bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    sched atlantis.schedules;
    skips boolean := coalesce(schedule_advance.overlap, 'skip') <> 'allow';
    latest timestamptz;
    open_slot timestamptz;
    skipped_to timestamptz;
    s timestamptz;
    new_id bigint;
BEGIN
    job_ids := '{}';
    job_slots := '{}';
    skipped := 0;
    IF NOT pg_try_advisory_xact_lock(hashtext('atlantis.schedule_runs'), hashtext(job_name)) THEN
        outcome := 'busy';
        RETURN;
    END IF;
    sched := atlantis.schedule_lock(job_name);
    latest := atlantis.schedule_cursor(job_name);
    last_slot := latest;
    IF NOT sched.enabled THEN
        outcome := 'disabled';
        RETURN;
    END IF;
    IF latest IS DISTINCT FROM schedule_advance.after THEN
        outcome := 'stale';
        RETURN;
    END IF;
    IF latest IS NOT NULL AND coalesce(schedule_advance.missed, 0) > 0
       AND missed_to > latest THEN
        INSERT INTO atlantis.schedule_runs AS r (job, slot, missed, missed_from)
        VALUES (job_name, missed_to, schedule_advance.missed,
                coalesce(schedule_advance.missed_from, missed_to));
        latest := missed_to;
    END IF;
    IF skips THEN
        SELECT o.slot, o.job_id INTO open_slot, open_job
          FROM atlantis.schedule_open_run(job_name, sched.open_from) AS o;
    END IF;
    FOREACH s IN ARRAY coalesce(due, '{}') LOOP
        CONTINUE WHEN latest IS NOT NULL AND s <= latest;
        latest := s;
        IF open_job IS NOT NULL THEN
            skipped := skipped + 1;
            skipped_to := s;
            CONTINUE;
        END IF;
        new_id := atlantis.enqueue(job_name, '{}');
        INSERT INTO atlantis.schedule_runs (job, slot, job_id) VALUES (job_name, s, new_id);
        job_ids := job_ids || new_id;
        job_slots := job_slots || s;
        IF skips THEN
            open_job := new_id;
            open_slot := s;
        END IF;
    END LOOP;
    IF skipped > 0 OR (skips AND coalesce(open_slot, latest) IS DISTINCT FROM sched.open_from) THEN
        UPDATE atlantis.schedules AS c
           SET skipped = c.skipped + schedule_advance.skipped,
               last_skipped = coalesce(skipped_to, c.last_skipped),
               open_from = CASE WHEN skips THEN coalesce(open_slot, latest) ELSE c.open_from END
         WHERE c.job = job_name;
    END IF;
    outcome := 'done';
    last_slot := latest;
END
$$;
REVOKE ALL ON FUNCTION
    atlantis.schedule_advance(text, timestamptz, timestamptz, timestamptz, bigint,
                              timestamptz[], text)
    FROM PUBLIC;

-- The call of the previous release's supervisors (0.2.0; migration 0015): atlantis.
-- schedule_advance with the job's stored overlap (job_types.overlap, synced by this release;
-- NULL reads as 'skip'). A disabled schedule answers 'busy' (an outcome they know: nothing
-- done, ask again next round).
CREATE OR REPLACE FUNCTION atlantis.schedule_catch_up(job_name text, after timestamptz,
                                           missed_from timestamptz, missed_to timestamptz,
                                           missed bigint, due timestamptz[],
                                           OUT outcome text, OUT last_slot timestamptz,
                                           OUT job_ids bigint[])
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    done record;
BEGIN
    SELECT a.outcome, a.last_slot, a.job_ids INTO done
      FROM atlantis.schedule_advance(
               job_name, schedule_catch_up.after, schedule_catch_up.missed_from,
               schedule_catch_up.missed_to, schedule_catch_up.missed, schedule_catch_up.due,
               (SELECT t.overlap FROM atlantis.job_types t WHERE t.job = job_name)) AS a;
    outcome := CASE WHEN done.outcome = 'disabled' THEN 'busy' ELSE done.outcome END;
    last_slot := done.last_slot;
    job_ids := done.job_ids;
END
$$;
REVOKE ALL ON FUNCTION
    atlantis.schedule_catch_up(text, timestamptz, timestamptz, timestamptz, bigint,
                               timestamptz[])
    FROM PUBLIC;

-- One slot of a schedule (the call of 0.1.0's supervisors), under the same locks as
-- schedule_advance: a slot at or before the schedule's cursor is 'taken' (it may lie inside a
-- run of missed slots), and so is any slot while the schedule is disabled; a slot past `grace`
-- is 'missed' (a row of one; 'skipped' for a schedule that never ran); with the job's stored
-- overlap 'skip' (or none) and a run still waiting or running, the slot is counted skipped
-- and 'taken'; else the job is 'enqueued' with its default args and its id returned.
CREATE OR REPLACE FUNCTION atlantis.schedule_fire(job_name text, slot timestamptz,
                                                  grace interval,
                                                  OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    sched atlantis.schedules;
    latest timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('atlantis.schedule_runs'), hashtext(job_name));
    sched := atlantis.schedule_lock(job_name);
    latest := atlantis.schedule_cursor(job_name);
    IF schedule_fire.slot < now() - grace AND latest IS NULL THEN
        outcome := 'skipped';
        RETURN;
    END IF;
    IF schedule_fire.slot <= latest OR NOT sched.enabled THEN
        outcome := 'taken';
        RETURN;
    END IF;
    IF schedule_fire.slot < now() - grace THEN
        INSERT INTO atlantis.schedule_runs AS r (job, slot, missed, missed_from)
        VALUES (job_name, schedule_fire.slot, 1, schedule_fire.slot);
        outcome := 'missed';
        RETURN;
    END IF;
    IF coalesce((SELECT t.overlap FROM atlantis.job_types t WHERE t.job = job_name), 'skip')
           <> 'allow'
       AND (SELECT o.job_id FROM atlantis.schedule_open_run(job_name, sched.open_from) AS o)
           IS NOT NULL THEN
        UPDATE atlantis.schedules AS c
           SET skipped = c.skipped + 1, last_skipped = schedule_fire.slot
         WHERE c.job = job_name;
        outcome := 'taken';
        RETURN;
    END IF;
    job_id := atlantis.enqueue(job_name, '{}');
    INSERT INTO atlantis.schedule_runs AS r (job, slot, job_id)
    VALUES (job_name, schedule_fire.slot, schedule_fire.job_id);
    outcome := 'enqueued';
END
$$;

-- The operator's switch (tide schedule disable|enable NAME, the console): no slot of a
-- disabled schedule is enqueued, nor counted missed or skipped; enabling it again records the
-- moment (enabled_from), from which its next round goes on: the slots of the time it was off
-- are never back-filled. Kept in atlantis.schedules (`enabled`, who and when in `changed_by`,
-- `changed_at`), which neither a deploy nor `tide db sync` touches. Waits for a firing of the
-- schedule under way (its row's lock). Returns whether the switch changed (false: it was so
-- already, and who and when stay as they were). ATL31 for a job that is not declared, or
-- declared without a schedule.
CREATE OR REPLACE FUNCTION atlantis.schedule_set_enabled(job_name text, enabled boolean,
                                                         by text DEFAULT current_user)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    declared text;
    sched atlantis.schedules;
BEGIN
    SELECT t.schedule INTO declared FROM atlantis.job_types t WHERE t.job = job_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no scheduled job %: tide schedule list shows them',
              quote_literal(job_name) USING ERRCODE = 'ATL31';
    END IF;
    IF declared IS NULL THEN
        RAISE EXCEPTION 'job % has no schedule: tide schedule list shows the scheduled jobs',
              quote_literal(job_name) USING ERRCODE = 'ATL31';
    END IF;
    sched := atlantis.schedule_lock(job_name);
    IF sched.enabled = schedule_set_enabled.enabled THEN
        RETURN false;
    END IF;
    UPDATE atlantis.schedules AS c
       SET enabled = schedule_set_enabled.enabled,
           changed_by = coalesce(schedule_set_enabled.by, current_user), changed_at = now(),
           enabled_from = CASE WHEN schedule_set_enabled.enabled THEN now()
                               ELSE c.enabled_from END
     WHERE c.job = job_name;
    RETURN true;
END
$$;

-- Forget slots recorded more than `older_than` ago, keeping each schedule's latest (what
-- `tide schedule list` shows as its last run, and proof that it ran before). Returns how
-- many rows went.
CREATE OR REPLACE FUNCTION atlantis.prune_schedule_runs(older_than interval, batch int DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH doomed AS (
        SELECT r.job, r.slot FROM atlantis.schedule_runs r
         WHERE r.created_at < now() - older_than
           AND r.slot < (SELECT max(l.slot) FROM atlantis.schedule_runs l WHERE l.job = r.job)
         ORDER BY r.created_at
         LIMIT greatest(coalesce(batch, 1000), 1)
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM atlantis.schedule_runs r USING doomed
         WHERE r.job = doomed.job AND r.slot = doomed.slot
        RETURNING 1
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;
