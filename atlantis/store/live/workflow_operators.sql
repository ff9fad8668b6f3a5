-- ---- Workflows: what operators do to them, their context, sweep and prune ------------

-- The workflow an operator acts on, locked (FOR NO KEY UPDATE); ATL04 when there is none.
-- One home for what cancel_workflow, retry_workflow and dismiss_workflow each begin with.
CREATE OR REPLACE FUNCTION atlantis.workflow_for_operator(workflow_id bigint)
RETURNS atlantis.workflow_instances
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w atlantis.workflow_instances;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i
     WHERE i.id = workflow_for_operator.workflow_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no workflow with id %', workflow_for_operator.workflow_id
            USING ERRCODE = 'ATL04';
    END IF;
    RETURN w;
END
$$;
REVOKE ALL ON FUNCTION atlantis.workflow_for_operator(bigint) FROM PUBLIC;

-- Cancel a workflow: its running steps are cancelled (with their grace), none starts, and
-- the compensations run as after a failure. During the compensation the cancel is recorded
-- and the compensations go on; a finished workflow is left alone. Returns its state
-- afterwards. `by` as atlantis.cancel's.
CREATE OR REPLACE FUNCTION atlantis.cancel_workflow(workflow_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    who text := coalesce(cancel_workflow.by, current_user);
BEGIN
    w := atlantis.workflow_for_operator(cancel_workflow.workflow_id);
    IF w.state IN ('running', 'compensating') AND w.cancel_requested_at IS NULL THEN
        UPDATE atlantis.workflow_instances i SET cancel_requested_at = now(), cancelled_by = who
         WHERE i.id = w.id;
    END IF;
    IF w.state = 'running' THEN
        PERFORM atlantis.workflow_stop(w.id, 'cancelled', NULL, atlantis.cancel_message(who));
    END IF;
    RETURN (SELECT i.state FROM atlantis.workflow_instances i WHERE i.id = w.id);
END
$$;

-- Rerun the compensations of a `compensation_failed` workflow that ended dead or cancelled
-- (a fresh attempt budget each, as atlantis.retry gives) and carry on from there; others
-- are refused (ATL05). A dismissed one is retried too (its dismissal is cleared): it takes
-- its unique key back, refused (ATL03, naming the holder) while another workflow holds it.
-- Returns the state afterwards.
CREATE OR REPLACE FUNCTION atlantis.retry_workflow(workflow_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    who text := coalesce(retry_workflow.by, current_user);
    r record;
    holder bigint;  -- version 22
BEGIN
    w := atlantis.workflow_for_operator(retry_workflow.workflow_id);
    IF w.state <> 'compensation_failed' THEN
        RAISE EXCEPTION 'workflow % is %: only a compensation_failed workflow can be retried',
            w.id, w.state USING ERRCODE = 'ATL05';
    END IF;
    BEGIN
        UPDATE atlantis.workflow_instances i
           SET state = 'compensating', finished_at = NULL, retried_by = who, retried_at = now(),
               dismissed_at = NULL, dismissed_by = NULL  -- version 22
         WHERE i.id = w.id;
    EXCEPTION WHEN unique_violation THEN
        -- Version 22: dismissed, its key was free, and another workflow took it since.
        holder := atlantis.workflow_key_holder(w.workflow, w.unique_key);
        RAISE EXCEPTION 'workflow % (%) holds the unique key % now; retry workflow % once '
                        'workflow % has finished or been dismissed',
            coalesce(holder::text, '?'), w.workflow, w.unique_key, w.id,
            coalesce(holder::text, '?') USING ERRCODE = 'ATL03';
    END;
    FOR r IN SELECT j.id, j.queue FROM atlantis.jobs j
              WHERE j.workflow_id = w.id AND j.compensation AND j.state IN ('dead', 'cancelled')
              ORDER BY j.id FOR NO KEY UPDATE LOOP
        UPDATE atlantis.jobs j
           SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
               claimed_by = NULL, claimed_until = NULL, cancel_requested_at = NULL,
               cancelled_by = NULL, progress_pct = NULL, progress_msg = NULL,
               progress_at = NULL, progress_history = '[]', last_error = NULL,
               retried_by = who, retried_at = now()
         WHERE j.id = r.id;
        PERFORM pg_notify('atlantis_jobs', r.queue);
    END LOOP;
    PERFORM pg_notify('atlantis_workflows', w.id::text);
    RETURN atlantis.workflow_settle(w.id);
END
$$;

-- Give up the owed undo of a `compensation_failed` workflow: it stays compensation_failed
-- (the state set does not grow), is recorded as dismissed (`dismissed_at`, `dismissed_by`)
-- and frees its unique key, so that a workflow of the same key may start. Others are refused
-- (ATL05); dismissing again changes nothing. `by` as atlantis.cancel's. Returns the state.
CREATE OR REPLACE FUNCTION atlantis.dismiss_workflow(workflow_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    who text := coalesce(dismiss_workflow.by, current_user);
BEGIN
    w := atlantis.workflow_for_operator(dismiss_workflow.workflow_id);
    IF w.state <> 'compensation_failed' THEN
        RAISE EXCEPTION 'workflow % is %: only a compensation_failed workflow can be dismissed',
            w.id, w.state USING ERRCODE = 'ATL05';
    END IF;
    IF w.dismissed_at IS NULL THEN
        UPDATE atlantis.workflow_instances i SET dismissed_at = now(), dismissed_by = who
         WHERE i.id = w.id;
        PERFORM pg_notify('atlantis_workflows', w.id::text);
    END IF;
    RETURN w.state;
END
$$;

-- What a step's handler gets besides its args (the claim returns it): its workflow and step,
-- whether it is a compensation, `results` (each transitive predecessor's result by step
-- name; in a compensation, the undone step's result and its own `results`), and
-- `compensating` (in a compensation: the failed step, NULL for a cancel or a timeout, and
-- the workflow's error). NULL for a job outside workflows.
CREATE OR REPLACE FUNCTION atlantis.step_context(job_id bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    j record;
    w atlantis.workflow_instances;
    found_results jsonb;
BEGIN
    SELECT x.workflow_id, x.step, x.compensation INTO j FROM atlantis.jobs x
     WHERE x.id = step_context.job_id;
    IF NOT FOUND OR j.workflow_id IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = j.workflow_id;
    WITH RECURSIVE up(name) AS (
        SELECT a.name FROM atlantis.workflow_steps ws CROSS JOIN LATERAL unnest(ws.after) AS a(name)
         WHERE ws.workflow_id = j.workflow_id AND ws.step = j.step
        UNION
        SELECT a.name FROM up
          JOIN atlantis.workflow_steps ws ON ws.workflow_id = j.workflow_id AND ws.step = up.name
         CROSS JOIN LATERAL unnest(ws.after) AS a(name)
    )
    SELECT coalesce(jsonb_object_agg(ws.step, r.result), '{}') INTO found_results
      FROM atlantis.workflow_steps ws
      LEFT JOIN atlantis.jobs r ON r.id = ws.job_id
     WHERE ws.workflow_id = j.workflow_id
       AND (ws.step IN (SELECT up.name FROM up) OR (j.compensation AND ws.step = j.step));
    RETURN jsonb_build_object(
        'workflow_id', j.workflow_id, 'step', j.step, 'compensation', j.compensation,
        'results', found_results,
        'compensating', CASE WHEN j.compensation THEN jsonb_build_object(
                                  'step', w.failed_step, 'error', w.error) END);
END
$$;

-- What only time finds: running workflows past their deadline fail (cause `timeout`); and
-- a stopped workflow's steps that a race left waiting, or running without a cancel request,
-- are halted again. Supervisors call it every rescue interval; locked instances are
-- skipped. Returns how many workflows it acted on.
CREATE OR REPLACE FUNCTION atlantis.workflow_sweep(batch int DEFAULT 100) RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w record;
    n int := 0;
BEGIN
    FOR w IN SELECT i.id, i.deadline - i.created_at AS took FROM atlantis.workflow_instances i
              WHERE i.state = 'running' AND i.deadline < now()
              ORDER BY i.deadline LIMIT batch FOR NO KEY UPDATE SKIP LOCKED LOOP
        PERFORM atlantis.workflow_stop(w.id, 'timeout', NULL,
                                       format('workflow timeout after %s', w.took));
        n := n + 1;
    END LOOP;
    FOR w IN SELECT i.id FROM atlantis.workflow_instances i
              WHERE i.state = 'compensating'
                AND EXISTS (SELECT 1 FROM atlantis.jobs j
                             WHERE j.workflow_id = i.id AND NOT j.compensation
                               AND (j.state = 'available'
                                    OR (j.state = 'running' AND j.cancel_requested_at IS NULL)))
              ORDER BY i.id LIMIT batch FOR NO KEY UPDATE SKIP LOCKED LOOP
        PERFORM atlantis.workflow_halt(w.id);
        PERFORM atlantis.workflow_settle(w.id);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- Delete at most `batch` finished workflows that finished more than `older_than` ago, with
-- every row of their steps and compensations (and those rows' attempts and logs): a step is
-- never pruned alone. `states` as atlantis.prune's: `complete` prunes complete workflows,
-- `cancelled` cancelled ones, `dead` failed and compensation_failed ones. Returns how many
-- job rows went.
CREATE OR REPLACE FUNCTION atlantis.prune_workflows(older_than interval,
                                         states text[] DEFAULT ARRAY['complete', 'cancelled', 'dead'],
                                         batch int DEFAULT 100) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH doomed AS (
        SELECT i.id FROM atlantis.workflow_instances i
         WHERE i.finished_at IS NOT NULL AND i.finished_at < now() - older_than
           AND CASE i.state WHEN 'complete' THEN 'complete' = ANY (states)
                            WHEN 'cancelled' THEN 'cancelled' = ANY (states)
                            WHEN 'failed' THEN 'dead' = ANY (states)
                            WHEN 'compensation_failed' THEN 'dead' = ANY (states)
                            ELSE false END
         ORDER BY i.finished_at
         LIMIT greatest(coalesce(batch, 100), 1)
           FOR UPDATE SKIP LOCKED
    ), instances AS (
        DELETE FROM atlantis.workflow_instances i USING doomed WHERE i.id = doomed.id
        RETURNING i.id
    ), gone AS (
        DELETE FROM atlantis.jobs j USING instances WHERE j.workflow_id = instances.id
        RETURNING j.id
    ), attempts AS (
        DELETE FROM atlantis.attempts a WHERE a.job_id IN (SELECT id FROM gone)
    ), logs AS (
        DELETE FROM atlantis.logs l WHERE l.job_id IN (SELECT id FROM gone)
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;
