-- ---- Workflows (migration 0017) ---------------------------------------------------------
--
-- A workflow's steps are ordinary rows of atlantis.jobs carrying `workflow_id` and `step`
-- (`compensation` true on an undo's row). Every transition of one workflow runs under a
-- lock on its row of atlantis.workflow_instances (FOR NO KEY UPDATE), taken first; the
-- trigger jobs_workflow_advance runs them in the transaction that changed a step's row, so
-- that whoever ends a row (a supervisor of any release, a rescue, an operator) advances its
-- workflow, and a step becomes runnable exactly once.
-- Job rows other than the one that changed are only ever locked with SKIP LOCKED: a
-- transaction holding a step's row (a finish, a claim) may be waiting for the instance, and
-- must never be waited for in turn. A row skipped that way is being changed by someone whose
-- own transition runs after ours and sees our state; atlantis.workflow_sweep sends again any
-- cancel that a skip left unsent.

-- The declaration of `workflow_name` from atlantis.workflow_types; ATL01 when unknown.
CREATE OR REPLACE FUNCTION atlantis.workflow_type(workflow_name text) RETURNS atlantis.workflow_types
LANGUAGE plpgsql STABLE AS $$
DECLARE
    decl atlantis.workflow_types;
BEGIN
    SELECT * INTO decl FROM atlantis.workflow_types t WHERE t.workflow = workflow_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown workflow %', workflow_name
            USING ERRCODE = 'ATL01',
                  HINT = 'sync the declarations into the database: tide db sync --app '
                         'package.module:registry (atlantis-supervise does it at start)';
    END IF;
    RETURN decl;
END
$$;

-- The args a step's job (or a compensation's) takes from its workflow's: the fields the job
-- declares, by name, checked against its declaration (its defaults filled in).
CREATE OR REPLACE FUNCTION atlantis.step_args(job_name text, args jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    decl atlantis.job_types := atlantis.job_type(job_name);
BEGIN
    RETURN atlantis.check_args(decl, coalesce((
        SELECT jsonb_object_agg(a.key, a.value) FROM jsonb_each(step_args.args) AS a
         WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(decl.fields) AS d
                        WHERE d->>'name' = a.key)), '{}'));
END
$$;

-- Insert the row of step `s` (or, `undo`, of its compensation) and record its id. No unique
-- key: a step's job `unique` does not apply inside a workflow.
CREATE OR REPLACE FUNCTION atlantis.workflow_add_step_row(w atlantis.workflow_instances,
                                                          s atlantis.workflow_steps,
                                                          undo boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    job_name text := CASE WHEN undo THEN s.compensate ELSE s.job END;
    decl atlantis.job_types := atlantis.job_type(job_name);
    new_id bigint;
    step_args jsonb := atlantis.step_args(job_name, w.args);
BEGIN
    INSERT INTO atlantis.jobs (job, queue, args, max_attempts, priority, timeout, heartbeat,
                               backoff, workflow_id, step, compensation, limit_group,
                               trace_context)
    VALUES (decl.job, decl.queue, step_args, decl.max_attempts,
            decl.priority, decl.timeout, decl.heartbeat, decl.backoff, w.id, s.step, undo,
            atlantis.limit_group(decl, step_args, EXISTS (
                SELECT 1 FROM atlantis.queues q
                 WHERE q.name = decl.queue AND q.concurrency IS NOT NULL)),
            w.trace_context)
    RETURNING id INTO new_id;
    IF undo THEN
        UPDATE atlantis.workflow_steps ws SET comp_job_id = new_id
         WHERE ws.workflow_id = w.id AND ws.step = s.step;
    ELSE
        UPDATE atlantis.workflow_steps ws SET job_id = new_id
         WHERE ws.workflow_id = w.id AND ws.step = s.step;
    END IF;
    RETURN new_id;
END
$$;

-- The workflow of type `workflow_name` that holds unique key `key`, NULL when none does. A
-- key is held (the index workflow_instances_unique_idx of migration 0022, which this lookup
-- follows) while its workflow is `running` or `compensating`, and while it is
-- `compensation_failed` with its undo still owed: until an operator dismisses it
-- (atlantis.dismiss_workflow). `failed`, `cancelled` and `complete` hold nothing.
CREATE OR REPLACE FUNCTION atlantis.workflow_key_holder(workflow_name text, key text)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT i.id FROM atlantis.workflow_instances i
     WHERE i.workflow = workflow_key_holder.workflow_name AND i.unique_key IS NOT NULL
       AND atlantis.key_digest(i.unique_key) = atlantis.key_digest(workflow_key_holder.key)
       AND i.dismissed_at IS NULL
       AND i.state IN ('running', 'compensating', 'compensation_failed')
     LIMIT 1
$$;

-- Start a workflow in the caller's transaction; returns its id. The args are checked as an
-- enqueue checks a job's (ATL02 naming the workflow and the field), and so are the args
-- each step and compensation will take, now rather than when a step becomes runnable.
-- A workflow declared `unique (...)` returns the id of the one holding the key
-- (atlantis.workflow_key_holder), whatever its state. The steps without `after` get their
-- rows at once.
CREATE OR REPLACE FUNCTION atlantis.start_workflow(name text, args jsonb DEFAULT '{}',
                                                   trace_context jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    decl atlantis.workflow_types := atlantis.workflow_type(start_workflow.name);
    as_job atlantis.job_types;
    checked jsonb;
    key text;
    w atlantis.workflow_instances;
    s atlantis.workflow_steps;
    e jsonb;
    msg text;
    existing bigint;
BEGIN
    as_job.job := decl.workflow;
    as_job.fields := decl.fields;
    as_job.unique_fields := decl.unique_fields;
    BEGIN
        checked := atlantis.check_args(as_job, start_workflow.args);
    EXCEPTION WHEN SQLSTATE 'ATL02' THEN
        GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
        RAISE EXCEPTION 'workflow %', substr(msg, 5) USING ERRCODE = 'ATL02';
    END;
    FOR e IN SELECT x FROM jsonb_array_elements(decl.steps) AS x LOOP
        BEGIN
            PERFORM atlantis.step_args(e->>'job', checked);
            IF e->>'compensate' IS NOT NULL THEN
                PERFORM atlantis.step_args(e->>'compensate', checked);
            END IF;
        EXCEPTION WHEN SQLSTATE 'ATL02' THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
            RAISE EXCEPTION 'workflow %, step %: %', decl.workflow, e->>'step', msg
                USING ERRCODE = 'ATL02';
        END;
    END LOOP;
    key := atlantis.unique_key(as_job, checked);
    LOOP
        -- Version 22: no conflict target: the unique index decides which states hold a key
        -- (workflow_instances_unique_idx), and the holder is looked up after.
        INSERT INTO atlantis.workflow_instances (workflow, args, unique_key, deadline,
                                                 trace_context)
        VALUES (decl.workflow, checked, key, now() + decl.timeout, start_workflow.trace_context)
        ON CONFLICT DO NOTHING
        RETURNING * INTO w;
        EXIT WHEN FOUND;
        existing := atlantis.workflow_key_holder(decl.workflow, key);
        IF existing IS NOT NULL THEN
            RETURN existing;
        END IF;
    END LOOP;
    INSERT INTO atlantis.workflow_steps (workflow_id, step, ord, job, after, compensate,
                                         pending)
    SELECT w.id, x.e->>'step', x.o::int, x.e->>'job', d.after, x.e->>'compensate',
           cardinality(d.after)
      FROM jsonb_array_elements(decl.steps) WITH ORDINALITY AS x(e, o)
     CROSS JOIN LATERAL (
            SELECT coalesce(array_agg(DISTINCT a), '{}') AS after
              FROM jsonb_array_elements_text(x.e->'after') AS a) d;
    IF NOT FOUND THEN  -- no steps: nothing to do
        UPDATE atlantis.workflow_instances SET state = 'complete', finished_at = now()
         WHERE id = w.id;
        RETURN w.id;
    END IF;
    FOR s IN SELECT * FROM atlantis.workflow_steps ws
              WHERE ws.workflow_id = w.id AND ws.pending = 0 ORDER BY ws.ord LOOP
        PERFORM atlantis.workflow_add_step_row(w, s, false);
    END LOOP;
    RETURN w.id;
END
$$;

-- Each step of a workflow with its row's state (`fwd`), its compensation's (`comp`), whether
-- it `started` (a child began its handler at least once: a completed step, or one with an
-- attempt recorded by a child or rescued by lease expiry; a row claimed ahead and given
-- back unspent did not), and whether it is `settled`: it never got a row, or its row ended
-- and nothing of it is left to undo (it did not start, has no compensation, or its
-- compensation completed).
CREATE OR REPLACE FUNCTION atlantis.workflow_step_states(wid bigint)
RETURNS TABLE (step text, ord int, job text, after text[], compensate text, job_id bigint,
               comp_job_id bigint, fwd text, comp text, started boolean, settled boolean)
LANGUAGE sql STABLE AS $$
    SELECT st.step, st.ord, st.job, st.after, st.compensate, st.job_id, st.comp_job_id,
           st.fwd, st.comp, st.started,
           st.job_id IS NULL OR st.fwd IS NULL
               OR (st.fwd IN ('complete', 'dead', 'cancelled')
                   AND (NOT st.started OR st.compensate IS NULL
                        OR st.comp IS NOT DISTINCT FROM 'complete'))
      FROM (SELECT ws.step, ws.ord, ws.job, ws.after, ws.compensate, ws.job_id,
                   ws.comp_job_id, f.state AS fwd, c.state AS comp,
                   f.state = 'complete' OR EXISTS (
                       SELECT 1 FROM atlantis.attempts a
                        WHERE a.job_id = ws.job_id
                          AND (a.child_pid IS NOT NULL OR a.outcome = 'lease_expired'))
                       AS started
              FROM atlantis.workflow_steps ws
              LEFT JOIN atlantis.jobs f ON f.id = ws.job_id
              LEFT JOIN atlantis.jobs c ON c.id = ws.comp_job_id
             WHERE ws.workflow_id = wid) st
$$;

-- Stop the forward steps of a workflow that stopped: those waiting never start (they end
-- `cancelled` at once); those running are cancelled as `tide job cancel` does (the
-- supervisor tells the handler, then stops it after its grace). Rows another transaction
-- holds are skipped (see above). Returns how many rows it changed.
CREATE OR REPLACE FUNCTION atlantis.workflow_halt(wid bigint) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w atlantis.workflow_instances;
    who text;
    message text;
    r record;
    n int := 0;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = wid;
    who := coalesce(w.cancelled_by, format('workflow %s', wid));
    message := atlantis.cancel_message(who);
    FOR r IN SELECT j.id FROM atlantis.jobs j
              WHERE j.workflow_id = wid AND NOT j.compensation AND j.state = 'available'
              ORDER BY j.id FOR NO KEY UPDATE SKIP LOCKED LOOP
        UPDATE atlantis.jobs j
           SET state = 'cancelled', finished_at = now(), cancelled_by = who,
               last_error = message, error_count = j.error_count + 1,
               errors = atlantis.errors_append(j.errors, atlantis.cancel_entry(j.run, j.attempt, who)
                                                         || jsonb_build_object('at', now()))
         WHERE j.id = r.id AND j.state = 'available';
        PERFORM pg_notify('atlantis_finished', r.id::text);  -- atlantis.wait (issue 36)
        n := n + 1;
    END LOOP;
    FOR r IN SELECT j.id, j.claimed_by FROM atlantis.jobs j
              WHERE j.workflow_id = wid AND NOT j.compensation AND j.state = 'running'
                AND j.cancel_requested_at IS NULL
              ORDER BY j.id FOR NO KEY UPDATE SKIP LOCKED LOOP
        UPDATE atlantis.jobs j SET cancel_requested_at = now(), cancelled_by = who
         WHERE j.id = r.id;
        PERFORM pg_notify('atlantis_control', json_build_object(
            'op', 'cancel', 'job_id', r.id, 'worker', r.claimed_by)::text);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- A running workflow stops (`why`: failed, cancelled or timeout; `step_name`: the step that
-- failed, NULL for a cancel or a timeout): it turns `compensating`, its steps are halted,
-- and the compensations that may start do.
CREATE OR REPLACE FUNCTION atlantis.workflow_stop(wid bigint, why text, step_name text,
                                                  message text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE atlantis.workflow_instances i
       SET state = 'compensating', cause = why, failed_step = step_name, error = message
     WHERE i.id = wid AND i.state = 'running';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('atlantis_workflows', wid::text);
    PERFORM atlantis.workflow_halt(wid);
    PERFORM atlantis.workflow_settle(wid);
END
$$;

-- The compensation phase, one step further: start the compensation of every step that
-- started, has left `running`, and whose dependents are all settled (reverse dependency
-- order; independent branches at once); then end the workflow when every step is settled
-- (`failed` or `cancelled`, by its cause), or `compensation_failed` when nothing is left
-- running and something could not be undone (a compensation ended dead or cancelled, or
-- its row could not be made). Safe to call again at any time. Returns the state after.
CREATE OR REPLACE FUNCTION atlantis.workflow_settle(wid bigint) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w atlantis.workflow_instances;
    s atlantis.workflow_steps;
    ready text;
    msg text;
    all_settled boolean;
    busy boolean;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = wid;
    IF NOT FOUND OR w.state <> 'compensating' THEN
        RETURN w.state;
    END IF;
    FOR ready IN
        SELECT f.step FROM atlantis.workflow_step_states(wid) f
         WHERE NOT f.settled AND f.started AND f.compensate IS NOT NULL
           AND f.comp_job_id IS NULL AND f.fwd IN ('complete', 'dead', 'cancelled')
           AND NOT EXISTS (SELECT 1 FROM atlantis.workflow_step_states(wid) d
                            WHERE f.step = ANY (d.after) AND NOT d.settled)
         ORDER BY f.ord DESC
    LOOP
        SELECT * INTO s FROM atlantis.workflow_steps ws
         WHERE ws.workflow_id = wid AND ws.step = ready;
        BEGIN
            PERFORM atlantis.workflow_add_step_row(w, s, true);
        EXCEPTION WHEN SQLSTATE 'ATL01' OR SQLSTATE 'ATL02' OR data_exception
                       OR integrity_constraint_violation THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
            UPDATE atlantis.workflow_instances i
               SET error = format('%s; the compensation of step %s could not start: %s',
                                  w.error, ready, msg)
             WHERE i.id = wid;
        END;
    END LOOP;
    SELECT bool_and(f.settled),
           coalesce(bool_or(f.fwd IN ('available', 'running')
                            OR f.comp IN ('available', 'running')), false)
      INTO all_settled, busy
      FROM atlantis.workflow_step_states(wid) f;
    IF all_settled THEN
        UPDATE atlantis.workflow_instances i
           SET state = CASE WHEN i.cause = 'cancelled' THEN 'cancelled' ELSE 'failed' END,
               finished_at = now()
         WHERE i.id = wid RETURNING * INTO w;
        PERFORM pg_notify('atlantis_workflows', wid::text);
    ELSIF NOT busy THEN
        UPDATE atlantis.workflow_instances i
           SET state = 'compensation_failed', finished_at = now()
         WHERE i.id = wid RETURNING * INTO w;
        PERFORM pg_notify('atlantis_workflows', wid::text);
    END IF;
    RETURN w.state;
END
$$;

-- Trigger jobs_workflow_advance (AFTER UPDATE OF state, on rows of a workflow, when the
-- state changed to anything but running): the workflow's transition for that change.
-- - A step complete: each dependent whose dependencies are now all complete gets its row
--   (exactly once: the instance's lock orders concurrent completions, and `pending` counts
--   down once per dependency); the last step complete completes the workflow.
-- - A step dead: the workflow fails (compensating). A step cancelled: the workflow is
--   cancelled (an operator's SQL; atlantis.cancel cancels the workflow itself).
-- - A step that went back to wait (a retry's backoff, a snooze, a drain) in a workflow that
--   stopped meanwhile never runs again: it is cancelled.
-- - In the compensation phase, any change of a step's or a compensation's row may let the
--   next compensations start, or end the workflow.
CREATE OR REPLACE FUNCTION atlantis.workflow_advance() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    s atlantis.workflow_steps;
    ready text[];
    name text;
    msg text;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = NEW.workflow_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF w.state <> 'running' THEN
        IF NEW.state = 'available' AND NOT NEW.compensation
           AND w.state IN ('compensating', 'failed', 'cancelled', 'compensation_failed') THEN
            PERFORM atlantis.workflow_halt(w.id);  -- this row among them (ours: never skipped)
        END IF;
        PERFORM atlantis.workflow_settle(w.id);
        RETURN NULL;
    END IF;
    IF NEW.compensation THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'complete' THEN
        WITH d AS (
            UPDATE atlantis.workflow_steps ws SET pending = ws.pending - 1
             WHERE ws.workflow_id = w.id AND NEW.step = ANY (ws.after) AND ws.job_id IS NULL
               AND ws.pending > 0
            RETURNING ws.step, ws.ord, ws.pending
        )
        SELECT array_agg(d.step ORDER BY d.ord) INTO ready FROM d WHERE d.pending = 0;
        FOREACH name IN ARRAY coalesce(ready, '{}') LOOP
            SELECT * INTO s FROM atlantis.workflow_steps ws
             WHERE ws.workflow_id = w.id AND ws.step = name;
            BEGIN
                PERFORM atlantis.workflow_add_step_row(w, s, false);
            EXCEPTION WHEN SQLSTATE 'ATL01' OR SQLSTATE 'ATL02' OR data_exception
                           OR integrity_constraint_violation THEN
                GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
                PERFORM atlantis.workflow_stop(w.id, 'failed', name,
                                               format('step %s could not start: %s', name, msg));
                RETURN NULL;
            END;
        END LOOP;
        IF NOT EXISTS (SELECT 1 FROM atlantis.workflow_steps ws
                         LEFT JOIN atlantis.jobs j ON j.id = ws.job_id
                        WHERE ws.workflow_id = w.id AND j.state IS DISTINCT FROM 'complete') THEN
            UPDATE atlantis.workflow_instances i SET state = 'complete', finished_at = now()
             WHERE i.id = w.id;
            PERFORM pg_notify('atlantis_workflows', w.id::text);
        END IF;
    ELSIF NEW.state = 'dead' THEN
        PERFORM atlantis.workflow_stop(w.id, 'failed', NEW.step,
                                       format('step %s failed: %s', NEW.step,
                                              coalesce(NEW.last_error, 'dead')));
    ELSIF NEW.state = 'cancelled' THEN
        UPDATE atlantis.workflow_instances i
           SET cancel_requested_at = now(), cancelled_by = coalesce(NEW.cancelled_by, i.cancelled_by)
         WHERE i.id = w.id;
        PERFORM atlantis.workflow_stop(w.id, 'cancelled', NULL,
                                       coalesce(NEW.last_error, 'cancelled'));
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION atlantis.workflow_advance() FROM PUBLIC;
