-- atlantis schema, version 15: schedules fire every slot within the grace, and count the
-- rest as missed, one row per run of missed slots.
--
-- A row of atlantis.schedule_runs without a job now stands for `missed` slots: from
-- `missed_from` to `slot` (its primary key, the latest of them), both slots of the schedule.
-- A long outage is one row with its count, never a row per slot. Rows written before this
-- version stand for one slot each.

ALTER TABLE atlantis.schedule_runs
    ADD COLUMN missed bigint NOT NULL DEFAULT 0,
    ADD COLUMN missed_from timestamptz;

UPDATE atlantis.schedule_runs SET missed = 1, missed_from = slot
 WHERE job_id IS NULL AND missed = 0;

-- Every slot of one schedule since the latest one recorded, in one transaction. The caller
-- (the supervisors' scheduler, which does the cron arithmetic) read `after`, the latest slot
-- recorded for the job (NULL if none), and passes what follows it up to the database's clock:
-- `missed` slots from `missed_from` to `missed_to`, past the grace, and `due`, the slots
-- within the grace, in order. One caller per schedule at a time (an advisory lock on the
-- job's name, not waited for: while another holds it, `outcome` is 'busy' and nothing is
-- done, so that a supervisor stopped inside this function holds up no other); if the latest
-- slot recorded is no longer `after` (another supervisor was
-- first, or an older one fired a slot with atlantis.schedule_fire), nothing is done and
-- `outcome` is 'stale' with that slot in `last_slot`: the caller computes again from it.
-- Else the missed slots become one row (none when the schedule never ran: a new schedule
-- does not count its past as missed), each due slot a row and a job with the default args,
-- and `outcome` is 'done', with `last_slot` the latest slot now recorded and `job_ids` the
-- new jobs in the order of `due`.
CREATE FUNCTION atlantis.schedule_catch_up(job_name text, after timestamptz,
                                           missed_from timestamptz, missed_to timestamptz,
                                           missed bigint, due timestamptz[],
                                           OUT outcome text, OUT last_slot timestamptz,
                                           OUT job_ids bigint[])
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    latest timestamptz;
    s timestamptz;
    new_id bigint;
BEGIN
    job_ids := '{}';
    IF NOT pg_try_advisory_xact_lock(hashtext('atlantis.schedule_runs'), hashtext(job_name)) THEN
        outcome := 'busy';
        RETURN;
    END IF;
    SELECT max(r.slot) INTO latest FROM atlantis.schedule_runs r WHERE r.job = job_name;
    IF latest IS DISTINCT FROM after THEN
        outcome := 'stale';
        last_slot := latest;
        RETURN;
    END IF;
    IF latest IS NOT NULL AND coalesce(schedule_catch_up.missed, 0) > 0
       AND missed_to > latest THEN
        INSERT INTO atlantis.schedule_runs AS r (job, slot, missed, missed_from)
        VALUES (job_name, missed_to, schedule_catch_up.missed,
                coalesce(schedule_catch_up.missed_from, missed_to));
        latest := missed_to;
    END IF;
    FOREACH s IN ARRAY coalesce(due, '{}') LOOP
        CONTINUE WHEN latest IS NOT NULL AND s <= latest;
        new_id := atlantis.enqueue(job_name, '{}');
        INSERT INTO atlantis.schedule_runs (job, slot, job_id) VALUES (job_name, s, new_id);
        job_ids := job_ids || new_id;
        latest := s;
    END LOOP;
    outcome := 'done';
    last_slot := latest;
END
$$;

-- schedule_fire as in 0006 (a previous release's supervisors call it while a fleet rolls),
-- under the same lock as schedule_catch_up: a slot at or before the latest one recorded is
-- 'taken' (it may lie inside a run of missed slots), and a missed slot is a row of one.
CREATE OR REPLACE FUNCTION atlantis.schedule_fire(job_name text, slot timestamptz,
                                                  grace interval,
                                                  OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    latest timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('atlantis.schedule_runs'), hashtext(job_name));
    SELECT max(r.slot) INTO latest FROM atlantis.schedule_runs r WHERE r.job = job_name;
    IF schedule_fire.slot < now() - grace AND latest IS NULL THEN
        outcome := 'skipped';
        RETURN;
    END IF;
    IF schedule_fire.slot <= latest THEN
        outcome := 'taken';
        RETURN;
    END IF;
    IF schedule_fire.slot < now() - grace THEN
        INSERT INTO atlantis.schedule_runs AS r (job, slot, missed, missed_from)
        VALUES (job_name, schedule_fire.slot, 1, schedule_fire.slot);
        outcome := 'missed';
        RETURN;
    END IF;
    job_id := atlantis.enqueue(job_name, '{}');
    INSERT INTO atlantis.schedule_runs AS r (job, slot, job_id)
    VALUES (job_name, schedule_fire.slot, schedule_fire.job_id);
    outcome := 'enqueued';
END
$$;

REVOKE ALL ON FUNCTION
    atlantis.schedule_catch_up(text, timestamptz, timestamptz, timestamptz, bigint,
                               timestamptz[])
    FROM PUBLIC;
