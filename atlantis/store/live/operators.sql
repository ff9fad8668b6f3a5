-- ---- Operators: stalls, cancel, retry, pause, resume, delete, prune ---------------------

-- The stall threshold of a job: its declaration's `stall`, else 3 x its heartbeat.
CREATE OR REPLACE FUNCTION atlantis.stall_after(job_name text, heartbeat interval) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT t.stall FROM atlantis.job_types t WHERE t.job = job_name),
                    heartbeat * 3)
$$;

-- Whether a running job has gone without a checkpoint (or, before its first one, since its
-- claim) for longer than its stall threshold.
CREATE OR REPLACE FUNCTION atlantis.stalled(j atlantis.jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.state = 'running'
       AND now() - coalesce(j.progress_at, j.started_at) > atlantis.stall_after(j.job, j.heartbeat)
$$;

-- Cancel a job. A waiting one is `cancelled` at once (its `errors` entry names the run); a
-- running one is flagged, and its supervisor (told on channel atlantis_control) tells the
-- handler, then stops it after its grace; the job ends `cancelled` whatever the attempt does
-- meanwhile. Returns the state the job is in afterwards ('cancelled' or 'running'), NULL
-- when it had finished already. `by` records who acted: the caller's role unless the caller
-- names someone; its default is evaluated by the caller, so it stays the caller's role
-- under SECURITY DEFINER.
CREATE OR REPLACE FUNCTION atlantis.cancel(job_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    j atlantis.jobs;
    who text := coalesce(cancel.by, current_user);
    message text;
    wid bigint;  -- version 17
BEGIN
    -- Version 17: a step (or a compensation) is cancelled with its whole workflow, its
    -- compensations included: a step cancelled alone would strand its dependents.
    SELECT x.workflow_id INTO wid FROM atlantis.jobs x WHERE x.id = cancel.job_id;
    IF wid IS NOT NULL THEN
        PERFORM atlantis.cancel_workflow(wid, who);
        RETURN (SELECT x.state FROM atlantis.jobs x WHERE x.id = cancel.job_id);
    END IF;
    SELECT * INTO j FROM atlantis.jobs WHERE id = cancel.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', cancel.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.state = 'available' THEN
        message := atlantis.cancel_message(who);
        UPDATE atlantis.jobs
           SET state = 'cancelled', finished_at = now(), cancelled_by = who,
               last_error = message, error_count = error_count + 1,
               errors = atlantis.errors_append(errors, atlantis.cancel_entry(j.run, j.attempt, who)
                                                       || jsonb_build_object('at', now()))
         WHERE id = j.id;
        -- atlantis.wait hears that it ended (the channel `finish` notifies; issue 36).
        PERFORM pg_notify('atlantis_finished', j.id::text);
        RETURN 'cancelled';
    END IF;
    IF j.state = 'running' THEN
        IF j.cancel_requested_at IS NULL THEN
            UPDATE atlantis.jobs SET cancel_requested_at = now(), cancelled_by = who
             WHERE id = j.id;
        END IF;
        -- Again on a repeated cancel: harmless, and it reaches a supervisor that missed one.
        PERFORM pg_notify('atlantis_control', json_build_object(
            'op', 'cancel', 'job_id', j.id, 'worker', j.claimed_by)::text);
        RETURN 'running';
    END IF;
    RETURN NULL;
END
$$;

-- Put a `dead` or `cancelled` job back to `available` with a fresh attempt budget, now.
-- Progress and the last error are cleared; `errors` and `error_count` are kept as history.
-- The unique key is recomputed from the job's args under its current declaration (kept as
-- it was when the job type is no longer declared); a key another waiting or running job
-- holds is refused (ATL03, naming that job). Wakes the queue's supervisors. Returns the id,
-- or NULL when the job is in another state.
CREATE OR REPLACE FUNCTION atlantis.retry(job_id bigint, by text DEFAULT current_user)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    j atlantis.jobs;
    who text := coalesce(retry.by, current_user);
    holder atlantis.jobs;
    decl atlantis.job_types;  -- version 12
BEGIN
    SELECT * INTO j FROM atlantis.jobs WHERE id = retry.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', retry.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.workflow_id IS NOT NULL THEN  -- version 17
        RAISE EXCEPTION 'job % is %step % of workflow %: use tide workflow retry %', j.id,
            CASE WHEN j.compensation THEN 'the compensation of ' ELSE '' END, j.step,
            j.workflow_id, j.workflow_id USING ERRCODE = 'ATL05';
    END IF;
    IF j.state NOT IN ('dead', 'cancelled') THEN
        RETURN NULL;
    END IF;
    -- Version 12: the key as atlantis.unique_key builds it today.
    SELECT * INTO decl FROM atlantis.job_types t WHERE t.job = j.job;
    IF FOUND THEN
        j.unique_key := atlantis.unique_key(decl, j.args);
    END IF;
    BEGIN
        UPDATE atlantis.jobs
           SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
               claimed_by = NULL, claimed_until = NULL, cancel_requested_at = NULL,
               cancelled_by = NULL, progress_pct = NULL, progress_msg = NULL,
               progress_at = NULL, progress_history = '[]', last_error = NULL,
               retried_by = who, retried_at = now(), suspended_for = NULL,
               unique_key = j.unique_key  -- version 12
         WHERE id = j.id;
    EXCEPTION WHEN unique_violation THEN
        -- jobs_unique_idx: another job of this name holds the key, waiting or running.
        SELECT * INTO holder FROM atlantis.jobs h
         WHERE h.job = j.job AND h.unique_key IS NOT NULL
           AND atlantis.key_digest(h.unique_key) = atlantis.key_digest(j.unique_key)
           AND h.state IN ('available', 'running') AND h.id <> j.id
         LIMIT 1;
        RAISE EXCEPTION 'job % (%) already holds the unique key %; retry job % once it has finished',
            coalesce(holder.id::text, '?'), j.job, atlantis.key_text(j.unique_key), j.id
            USING ERRCODE = 'ATL03';
    END;
    PERFORM pg_notify('atlantis_jobs', j.queue);
    RETURN j.id;
END
$$;

-- Stop supervisors claiming from `queue` (running attempts continue). Returns whether the
-- queue was being served until now.
CREATE OR REPLACE FUNCTION atlantis.pause(queue text, reason text DEFAULT NULL,
                               by text DEFAULT current_user) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    SELECT q.paused INTO was FROM atlantis.queues q WHERE q.name = pause.queue FOR UPDATE;
    INSERT INTO atlantis.queues AS q (name, paused, reason, changed_by, changed_at)
    VALUES (pause.queue, true, pause.reason, coalesce(pause.by, current_user), now())
    ON CONFLICT (name) DO UPDATE
       SET paused = true, reason = excluded.reason, changed_by = excluded.changed_by,
           changed_at = excluded.changed_at;
    PERFORM pg_notify('atlantis_control', json_build_object('op', 'pause', 'queue', pause.queue)::text);
    RETURN NOT coalesce(was, false);
END
$$;

-- Let supervisors claim from `queue` again. Returns whether it was paused until now.
CREATE OR REPLACE FUNCTION atlantis.resume(queue text, by text DEFAULT current_user) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    SELECT q.paused INTO was FROM atlantis.queues q WHERE q.name = resume.queue FOR UPDATE;
    INSERT INTO atlantis.queues AS q (name, paused, reason, changed_by, changed_at)
    VALUES (resume.queue, false, NULL, coalesce(resume.by, current_user), now())
    ON CONFLICT (name) DO UPDATE
       SET paused = false, reason = NULL, changed_by = excluded.changed_by,
           changed_at = excluded.changed_at;
    PERFORM pg_notify('atlantis_control', json_build_object('op', 'resume', 'queue', resume.queue)::text);
    -- Work may have piled up meanwhile: wake the queue's supervisors too.
    PERFORM pg_notify('atlantis_jobs', resume.queue);
    RETURN coalesce(was, false);
END
$$;

-- Delete finished jobs by id, with their attempts and logs (the console's delete, for a role
-- without table rights); returns how many jobs went. Waiting and running jobs are never
-- deleted.
CREATE OR REPLACE FUNCTION atlantis.delete_finished(ids bigint[]) RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    deleted int;
BEGIN
    WITH gone AS (
        DELETE FROM atlantis.jobs j
         WHERE j.id = ANY (delete_finished.ids) AND j.state IN ('complete', 'dead', 'cancelled')
           AND j.workflow_id IS NULL  -- version 17: atlantis.prune_workflows
           AND NOT atlantis.parent_live(j.parent_id)  -- version 28: children of a live parent
        RETURNING j.id
    ), attempts AS (
        DELETE FROM atlantis.attempts a USING gone WHERE a.job_id = gone.id
    ), logs AS (
        DELETE FROM atlantis.logs l USING gone WHERE l.job_id = gone.id
    )
    SELECT count(*)::int INTO deleted FROM gone;
    RETURN deleted;
END
$$;

-- Delete at most `batch` finished jobs in `states` (complete, cancelled, dead) that finished
-- more than `older_than` ago, oldest first, with their attempts and logs; returns how many
-- jobs were deleted. Waiting and running jobs are never deleted. One batch per call, so
-- that each runs in a short transaction: callers repeat while it returns `batch`. Rows
-- locked by someone else (a prune running beside this one) are skipped, not waited for.
CREATE OR REPLACE FUNCTION atlantis.prune(older_than interval,
                               states text[] DEFAULT ARRAY['complete', 'cancelled', 'dead'],
                               batch int DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
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
           AND j.workflow_id IS NULL  -- version 17: a workflow's rows go with it, below
           AND NOT atlantis.parent_live(j.parent_id)  -- version 28: kept for their parent's join
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
    IF deleted < batch THEN  -- version 17: finished workflows, with all their rows
        deleted := deleted + atlantis.prune_workflows(older_than, states, batch - deleted::int);
    END IF;
    RETURN deleted;
END
$$;
