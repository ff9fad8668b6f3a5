-- atlantis schema, version 6: cron schedules and retention.
--
-- SQLSTATE raised: 22023 (invalid_parameter_value) for a prune of a state other than
-- complete, cancelled or dead, or of a negative age.

-- One slot of a schedule, once, however many supervisors see it. The first caller for
-- (job, slot) records it in atlantis.schedule_runs and, if the slot is still within
-- `grace` of now(), enqueues the job with its default args, in the same transaction; any
-- later caller finds the row and does nothing. A slot first seen later than `grace` is
-- skipped: recorded without a job (job_id NULL), so that it is counted once, as missed,
-- if the schedule ran before (else it is the first slot ever seen of a new schedule, and
-- nothing is recorded). Returns what happened: 'enqueued', 'missed', 'skipped' or 'taken'
-- (someone else recorded the slot), with the new job's id when enqueued.
CREATE FUNCTION atlantis.schedule_fire(job_name text, slot timestamptz, grace interval,
                                       OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF schedule_fire.slot < now() - grace
       AND NOT EXISTS (SELECT 1 FROM atlantis.schedule_runs r WHERE r.job = job_name) THEN
        outcome := 'skipped';
        RETURN;
    END IF;
    INSERT INTO atlantis.schedule_runs AS r (job, slot) VALUES (job_name, schedule_fire.slot)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        outcome := 'taken';
        RETURN;
    END IF;
    IF schedule_fire.slot < now() - grace THEN
        outcome := 'missed';
        RETURN;
    END IF;
    job_id := atlantis.enqueue(job_name, '{}');
    UPDATE atlantis.schedule_runs r SET job_id = schedule_fire.job_id
     WHERE r.job = job_name AND r.slot = schedule_fire.slot;
    outcome := 'enqueued';
END
$$;

-- Delete at most `batch` finished jobs in `states` (complete, cancelled, dead) that finished
-- more than `older_than` ago, oldest first, with their attempts and logs; returns how many
-- jobs were deleted. Waiting and running jobs are never deleted. One batch per call, so
-- that each runs in a short transaction: callers repeat while it returns `batch`. Rows
-- locked by someone else (a prune running beside this one) are skipped, not waited for.
CREATE FUNCTION atlantis.prune(older_than interval,
                               states text[] DEFAULT ARRAY['complete', 'cancelled', 'dead'],
                               batch int DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    bad text;
    deleted bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'prune: the age must be 0 or more, not %', coalesce(older_than::text, 'null')
            USING ERRCODE = '22023';
    END IF;
    SELECT s INTO bad FROM unnest(coalesce(states, '{}')) AS s
     WHERE s IS NULL OR s NOT IN ('complete', 'cancelled', 'dead') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'prune: only complete, cancelled and dead jobs can be pruned, not %',
            coalesce(bad, 'null') USING ERRCODE = '22023';
    END IF;
    WITH doomed AS (
        SELECT j.id FROM atlantis.jobs j
         WHERE j.finished_at IS NOT NULL
           AND j.finished_at < now() - older_than
           AND j.state = ANY (states)
           AND j.state IN ('complete', 'cancelled', 'dead')
         ORDER BY j.finished_at
         LIMIT greatest(coalesce(batch, 1000), 1)
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM atlantis.jobs j USING doomed WHERE j.id = doomed.id RETURNING j.id
    ), attempts AS (
        DELETE FROM atlantis.attempts a WHERE a.job_id IN (SELECT id FROM gone)
    ), logs AS (
        DELETE FROM atlantis.logs l WHERE l.job_id IN (SELECT id FROM gone)
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;

-- Forget slots recorded more than `older_than` ago, keeping each schedule's latest (what
-- `tide schedule list` shows as its last run, and proof that it ran before). Returns how
-- many rows went.
CREATE FUNCTION atlantis.prune_schedule_runs(older_than interval, batch int DEFAULT 1000)
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
