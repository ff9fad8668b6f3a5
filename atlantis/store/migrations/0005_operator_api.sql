-- atlantis schema, version 5: the operator API in SQL.
--
-- Cancel, retry, pause and resume are written once, here; `atlantis.cancel(conn, id)` and
-- friends in Python, `tide` and the console all call these functions, so one set of rules
-- applies whichever way an operator goes. `by` records who acted: the database role unless
-- the caller names someone (tide passes the OS user). Its default is evaluated by the
-- caller, so it stays the caller's role even if a function is made SECURITY DEFINER.
--
-- SQLSTATEs raised: ATL03 a unique key is held by another job, ATL04 no job has this id.

-- The stall threshold of a job: its declaration's `stall`, else 3 x its heartbeat.
CREATE FUNCTION atlantis.stall_after(job_name text, heartbeat interval) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT t.stall FROM atlantis.job_types t WHERE t.job = job_name),
                    heartbeat * 3)
$$;

-- Whether a running job has gone without a checkpoint (or, before its first one, since its
-- claim) for longer than its stall threshold.
CREATE FUNCTION atlantis.stalled(j atlantis.jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.state = 'running'
       AND now() - coalesce(j.progress_at, j.started_at) > atlantis.stall_after(j.job, j.heartbeat)
$$;

-- Cancel a job. A waiting one is `cancelled` at once; a running one is flagged, and its
-- supervisor (told on channel atlantis_control) tells the handler, then stops it after its
-- grace; the job ends `cancelled` whatever the attempt does meanwhile.
-- Returns the state the job is in afterwards ('cancelled' or 'running'), NULL when it had
-- finished already.
CREATE FUNCTION atlantis.cancel(job_id bigint, by text DEFAULT current_user) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    j atlantis.jobs;
    who text := coalesce(cancel.by, current_user);
    message text;
BEGIN
    SELECT * INTO j FROM atlantis.jobs WHERE id = cancel.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', cancel.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.state = 'available' THEN
        message := format('cancelled by %s', who);
        UPDATE atlantis.jobs
           SET state = 'cancelled', finished_at = now(), cancelled_by = who,
               last_error = message, error_count = error_count + 1,
               errors = atlantis.errors_append(errors, jsonb_build_object(
                   'attempt', j.attempt, 'kind', 'cancelled', 'message', message,
                   'at', now(), 'by', who))
         WHERE id = j.id;
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
-- A `unique` job whose key another waiting or running job holds is refused (ATL03, naming
-- that job). Wakes the queue's supervisors. Returns the id, or NULL when the job is in
-- another state.
CREATE FUNCTION atlantis.retry(job_id bigint, by text DEFAULT current_user) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    j atlantis.jobs;
    who text := coalesce(retry.by, current_user);
    holder atlantis.jobs;
BEGIN
    SELECT * INTO j FROM atlantis.jobs WHERE id = retry.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', retry.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.state NOT IN ('dead', 'cancelled') THEN
        RETURN NULL;
    END IF;
    BEGIN
        UPDATE atlantis.jobs
           SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
               claimed_by = NULL, claimed_until = NULL, cancel_requested_at = NULL,
               cancelled_by = NULL, progress_pct = NULL, progress_msg = NULL,
               progress_at = NULL, progress_history = '[]', last_error = NULL,
               retried_by = who, retried_at = now()
         WHERE id = j.id;
    EXCEPTION WHEN unique_violation THEN
        -- jobs_unique_idx: another job of this name holds the key, waiting or running.
        SELECT * INTO holder FROM atlantis.jobs h
         WHERE h.job = j.job AND h.unique_key = j.unique_key
           AND h.state IN ('available', 'running') AND h.id <> j.id
         LIMIT 1;
        RAISE EXCEPTION 'job % (%) already holds the unique key %; retry job % once it has finished',
            coalesce(holder.id::text, '?'), j.job, j.unique_key, j.id
            USING ERRCODE = 'ATL03';
    END;
    PERFORM pg_notify('atlantis_jobs', j.queue);
    RETURN j.id;
END
$$;

-- Stop supervisors claiming from `queue` (running attempts continue). Returns whether the
-- queue was being served until now.
CREATE FUNCTION atlantis.pause(queue text, reason text DEFAULT NULL,
                               by text DEFAULT current_user) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
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
CREATE FUNCTION atlantis.resume(queue text, by text DEFAULT current_user) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
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
