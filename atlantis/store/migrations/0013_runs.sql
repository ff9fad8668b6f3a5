-- atlantis schema, version 13: runs, and who cancelled.
--
-- A run is one life of a job from `available` to a finished state: a new job is in run 1;
-- each retry of a dead or cancelled job (`tide job retry`, atlantis.retry, the console)
-- starts the next run, with a fresh attempt budget (`attempt` starts again at 1, so the
-- CHECK attempt <= max_attempts holds). Logs, the attempt history (atlantis.attempts) and
-- the entries of `errors` carry their run, so that run 2's attempt 1 is never mixed up with
-- run 1's. Rows from before this migration are in run 1 (the columns' default); their logs
-- read as before.
--
-- The run is counted by a trigger on the one change that starts a run (a finished job put
-- back to `available`), not inside atlantis.retry: every way to retry counts it, and the
-- body of atlantis.retry stays as the migrations before this one leave it (a later
-- CREATE OR REPLACE of retry needs no change for runs).
--
-- Writes made for an attempt (renewals, results) are fenced on the run too, from this
-- release on (queries.sql): a late result of run 1's attempt 1 never lands on run 2's
-- attempt 1, even when the same supervisor claimed both.
--
-- atlantis.cancel is redefined to put the run in the `errors` entry it writes; it is
-- otherwise as in migration 0005 (who cancelled: `by`, else the caller's role, is kept in
-- cancelled_by and named in last_error however the job then ends; see queries.sql).

ALTER TABLE atlantis.jobs
    ADD COLUMN run int NOT NULL DEFAULT 1
        CONSTRAINT jobs_run_check CHECK (run >= 1);

ALTER TABLE atlantis.attempts ADD COLUMN run int NOT NULL DEFAULT 1;

-- The default keeps a supervisor of the previous release (which names no run) writing:
-- its lines are put in run 1. Lines are read by (job_id, attempt) through logs_job_idx and
-- filtered by run: a job's lines of one attempt number are few (bounded per attempt).
ALTER TABLE atlantis.logs ADD COLUMN run int NOT NULL DEFAULT 1;

-- A finished job put back to `available` (a retry) starts its next run.
CREATE FUNCTION atlantis.next_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.run := OLD.run + 1;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_next_run
    BEFORE UPDATE OF state ON atlantis.jobs
    FOR EACH ROW
    WHEN (OLD.state IN ('dead', 'cancelled') AND NEW.state = 'available')
    EXECUTE FUNCTION atlantis.next_run();

-- As in migration 0005, with the run in the `errors` entry of a waiting job's cancel.
CREATE OR REPLACE FUNCTION atlantis.cancel(job_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
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
                   'run', j.run, 'attempt', j.attempt, 'kind', 'cancelled',
                   'message', message, 'at', now(), 'by', who))
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

-- atlantis.job_rows (migration 0009) with the run appended.
CREATE OR REPLACE VIEW atlantis.job_rows AS
SELECT j.id, j.job, j.queue, j.args, j.state, j.attempt, j.max_attempts, j.priority, j.run_at,
       extract(epoch FROM j.timeout)::float8 AS timeout,
       extract(epoch FROM j.heartbeat)::float8 AS heartbeat,
       j.claimed_by, j.claimed_until, j.progress_pct, j.progress_msg, j.progress_at,
       j.last_error, j.errors, j.error_count, j.created_at, j.started_at, j.finished_at,
       extract(epoch FROM j.backoff)::float8 AS backoff, j.unique_key, j.cancel_requested_at,
       j.cancelled_by, j.retried_by, j.retried_at, j.progress_history,
       extract(epoch FROM atlantis.stall_after(j.job, j.heartbeat))::float8 AS stall_after,
       atlantis.stalled(j) AS stalled, now() AS db_now, j.run
  FROM atlantis.jobs j;

REVOKE ALL ON FUNCTION atlantis.next_run() FROM PUBLIC;
