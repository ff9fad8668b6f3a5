-- ---- Schedules --------------------------------------------------------------------------

-- One slot of a schedule (the previous releases' supervisors call it; the current one calls
-- atlantis.schedule_catch_up), under the same lock as schedule_catch_up: a slot at or before
-- the latest one recorded is 'taken' (it may lie inside a run of missed slots), a slot past
-- `grace` is 'missed' (a row of one; 'skipped' for a schedule that never ran), else the job
-- is 'enqueued' with its default args and its id returned.
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
CREATE OR REPLACE FUNCTION atlantis.schedule_catch_up(job_name text, after timestamptz,
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
REVOKE ALL ON FUNCTION
    atlantis.schedule_catch_up(text, timestamptz, timestamptz, timestamptz, bigint,
                               timestamptz[])
    FROM PUBLIC;

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
