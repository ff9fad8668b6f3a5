-- ---- Handler steps (issue 34, migration 0026) ---------------------------------------------
-- What ctx.run_step, ctx.transaction and ctx.sleep record (atlantis.job_steps), written and
-- read by the child that runs the attempt, on its handler's connection. Every write is
-- fenced on the run: the job's row is locked FOR SHARE (a row lock held while the handler's
-- own code runs would block the lease's renewal, so the lock is taken last, just before
-- COMMIT) and must still be `running` under this run's id with its lease not expired by
-- the clock (clock_timestamp(): now() is the transaction's start, stale in a long one).
-- SQLSTATE ATL20: the run lost its lease; ATL21: no such job in this database (the
-- handler's database is not the jobs').

-- The fence: lock the row FOR SHARE and check that `run_id` still holds it, or raise.
CREATE OR REPLACE FUNCTION atlantis.step_fence(job_id bigint, run_id uuid) RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    j record;
BEGIN
    -- The row lock is held until COMMIT: a client that stalls before it (stopped, cut off)
    -- must not hold the supervisor's renewals up for long. The server ends such a session
    -- after 2 s idle in this transaction (rolled back: the next run reads no record).
    PERFORM set_config('idle_in_transaction_session_timeout', '2s', true);
    SELECT x.run_id, x.state, x.claimed_until INTO j
      FROM atlantis.jobs x WHERE x.id = step_fence.job_id FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job % in this database', step_fence.job_id USING ERRCODE = 'ATL21';
    END IF;
    IF j.run_id IS DISTINCT FROM step_fence.run_id OR j.state <> 'running'
       OR j.claimed_until <= clock_timestamp() THEN
        RAISE EXCEPTION 'this run of job % no longer holds its lease', step_fence.job_id
            USING ERRCODE = 'ATL20';
    END IF;
END
$$;

-- Every record of the job, for the run that holds it (read once, when the run first needs
-- them), in one statement of plain SQL: a run's first step pays one round trip. Besides the
-- records, one row whose name is NULL: `kind` says whether the run holds the job ('ok'),
-- lost it ('lost': no record is returned) or the job is not in this database ('missing'),
-- and `value` is the serving backend's pid (a pooler shows its client another one).
CREATE OR REPLACE FUNCTION atlantis.step_records(job_id bigint, run_id uuid)
RETURNS TABLE (name text, kind text, value text)
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
    WITH j AS MATERIALIZED (
        SELECT x.run_id = step_records.run_id AND x.state = 'running'
               AND x.claimed_until > clock_timestamp() AS held
          FROM atlantis.jobs x WHERE x.id = step_records.job_id
           FOR SHARE
    )
    SELECT NULL::text, CASE WHEN NOT EXISTS (SELECT 1 FROM j) THEN 'missing'
                            WHEN (SELECT held FROM j) THEN 'ok' ELSE 'lost' END,
           pg_backend_pid()::text
    UNION ALL
    SELECT s.name, s.kind, s.value::text FROM atlantis.job_steps s
     WHERE s.job_id = step_records.job_id AND (SELECT held FROM j)
$$;

-- Record one step's value for the run that holds the job and return when it was recorded;
-- raises ATL20 when the run no longer holds the job (the fence, atlantis.step_fence), so that
-- nothing is recorded and the transaction it ends cannot commit. In a transaction step this
-- is the last statement before COMMIT, sent with the COMMIT in one round trip (pipelined): a
-- fence that fails aborts the transaction and the COMMIT is never run, so the record, the
-- fence and the handler's writes commit together or not at all.
CREATE OR REPLACE FUNCTION atlantis.record_step(job_id bigint, run_id uuid, name text,
                                                kind text, value jsonb, attempt int)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    at timestamptz;
BEGIN
    PERFORM atlantis.step_fence(record_step.job_id, record_step.run_id);
    INSERT INTO atlantis.job_steps AS s (job_id, name, kind, value, bytes, run_id, attempt)
    VALUES (record_step.job_id, record_step.name, record_step.kind, record_step.value,
            octet_length(record_step.value::text), record_step.run_id, record_step.attempt)
    RETURNING s.recorded_at INTO at;
    RETURN at;
END
$$;

-- A durable sleep: its wake time is fixed when the sleep is first reached (`seconds` from
-- now, or `until`) and recorded like a step; `due` says whether it has passed.
CREATE OR REPLACE FUNCTION atlantis.step_sleep(job_id bigint, run_id uuid, name text,
                                               seconds float8, until timestamptz, attempt int)
RETURNS TABLE (wake timestamptz, due boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    recorded jsonb;
    at timestamptz;
BEGIN
    PERFORM atlantis.step_fence(step_sleep.job_id, step_sleep.run_id);
    SELECT s.value INTO recorded FROM atlantis.job_steps s
     WHERE s.job_id = step_sleep.job_id AND s.name = step_sleep.name AND s.kind = 'sleep';
    IF FOUND THEN
        at := (recorded->>'until')::timestamptz;
    ELSE
        at := coalesce(step_sleep.until,
                       clock_timestamp() + make_interval(secs => step_sleep.seconds));
        recorded := jsonb_build_object('until', at);
        INSERT INTO atlantis.job_steps (job_id, name, kind, value, bytes, run_id, attempt)
        VALUES (step_sleep.job_id, step_sleep.name, 'sleep', recorded,
                octet_length(recorded::text), step_sleep.run_id, step_sleep.attempt);
    END IF;
    wake := at;
    due := at <= clock_timestamp();
    RETURN NEXT;
END
$$;

-- Forget a job's step records (`tide job retry --fresh`): its next run starts from the
-- beginning. Returns how many were dropped.
CREATE OR REPLACE FUNCTION atlantis.clear_steps(job_id bigint) RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
    WITH gone AS (DELETE FROM atlantis.job_steps s WHERE s.job_id = clear_steps.job_id
                  RETURNING 1)
    SELECT count(*) FROM gone
$$;
