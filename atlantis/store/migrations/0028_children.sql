-- Children (issue 35): a handler's ctx.spawn enqueues a child job exactly once (its row keeps
-- its parent), ctx.join waits until listed jobs have ended. The bodies of the functions live
-- in atlantis/store/live/children.sql.

-- The job whose handler spawned this one (ctx.spawn), NULL otherwise. No foreign key: a
-- parent may be pruned before its children (never the other way: atlantis.prune keeps the
-- children of a live parent), and a key would lock the parent's row at every spawn and
-- rewrite every child when the parent goes.
ALTER TABLE atlantis.jobs ADD COLUMN parent_id bigint;

-- Children by parent and state: a child's end asks whether its parent has another child
-- still waiting or running (one probe, whatever the number of ended ones), a cancel finds
-- the children to cancel, `tide job status` counts them by state. Plain jobs are not in it.
CREATE INDEX jobs_children_idx ON atlantis.jobs (parent_id, state) WHERE parent_id IS NOT NULL;

-- A spawn and a join are handler steps of their own kinds: a spawn's record holds the id of
-- the job it enqueued (and whether it is a new child), a join's the ids it waits for.
ALTER TABLE atlantis.job_steps DROP CONSTRAINT job_steps_kind_check;
ALTER TABLE atlantis.job_steps ADD CONSTRAINT job_steps_kind_check
    CHECK (kind IN ('step', 'transaction', 'sleep', 'event', 'spawn', 'join'));

CREATE FUNCTION atlantis.step_spawn(job_id bigint, run_id uuid, name text, attempt int,
                                    job_name text, args jsonb, run_at timestamptz,
                                    priority int, queue text, delay interval,
                                    trace_context jsonb)
RETURNS TABLE (child bigint, fresh boolean)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;
CREATE FUNCTION atlantis.step_spawn_many(job_id bigint, run_id uuid, name text, attempt int,
                                         job_name text, args_list jsonb[], run_at timestamptz,
                                         priority int, queue text, delay interval,
                                         trace_context jsonb)
RETURNS TABLE (child bigint, fresh boolean)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;
CREATE FUNCTION atlantis.step_join(job_id bigint, run_id uuid, name text, attempt int,
                                   ids bigint[], results boolean)
RETURNS TABLE (id bigint, state text, result text, error text)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;
CREATE FUNCTION atlantis.join_ready(job_id bigint, name text) RETURNS boolean
LANGUAGE sql AS $$ SELECT false $$;
CREATE FUNCTION atlantis.join_sweep(n int) RETURNS bigint
LANGUAGE sql AS $$ SELECT 0::bigint $$;
CREATE FUNCTION atlantis.parent_live(parent_id bigint) RETURNS boolean
LANGUAGE sql AS $$ SELECT false $$;
CREATE FUNCTION atlantis.child_ended() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION atlantis.cancel_children() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION atlantis.wait_check() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;

-- A child's end wakes its parent when the parent waits in a join and this was its last
-- child still waiting or running: the parent's row is written once for the join, never
-- once per child (plain jobs: the WHEN is false, nothing runs).
CREATE TRIGGER jobs_child_end AFTER UPDATE OF state ON atlantis.jobs
    FOR EACH ROW
    WHEN (NEW.parent_id IS NOT NULL AND OLD.state IN ('available', 'running')
          AND NEW.state IN ('complete', 'dead', 'cancelled'))
    EXECUTE FUNCTION atlantis.child_ended();

-- Cancelling a job (at once, or asked of its running attempt) cancels its waiting and
-- running children, whoever cancelled it and however (tide, the console, SQL, a workflow).
CREATE TRIGGER jobs_cancel_children AFTER UPDATE OF state, cancel_requested_at ON atlantis.jobs
    FOR EACH ROW
    WHEN ((NEW.state = 'cancelled' AND OLD.state <> 'cancelled')
          OR (NEW.cancel_requested_at IS NOT NULL AND OLD.cancel_requested_at IS NULL))
    EXECUTE FUNCTION atlantis.cancel_children();

-- A run that suspends to wait for an event already sent, or for children already ended
-- (they ended while the run was suspending), is woken in the statement that suspends it.
CREATE TRIGGER jobs_wait_check AFTER UPDATE OF suspended_for ON atlantis.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'available'
          AND (NEW.suspended_for LIKE 'event:%' OR NEW.suspended_for LIKE 'join:%'))
    EXECUTE FUNCTION atlantis.wait_check();

-- atlantis.job_rows shows the parent (appended: a release one behind reads its own columns
-- by name). The query is the live one's (live/views.sql).
CREATE OR REPLACE VIEW atlantis.job_rows AS
SELECT j.id, j.job, j.queue, j.args, j.state, j.attempt, j.max_attempts, j.priority, j.run_at,
       extract(epoch FROM j.timeout)::float8 AS timeout,
       extract(epoch FROM j.heartbeat)::float8 AS heartbeat,
       j.claimed_by, j.claimed_until, j.progress_pct, j.progress_msg, j.progress_at,
       j.last_error, j.errors, j.error_count, j.created_at, j.started_at, j.finished_at,
       extract(epoch FROM j.backoff)::float8 AS backoff, j.unique_key, j.cancel_requested_at,
       j.cancelled_by, j.retried_by, j.retried_at, j.progress_history,
       extract(epoch FROM atlantis.stall_after(j.job, j.heartbeat))::float8 AS stall_after,
       atlantis.stalled(j) AS stalled, now() AS db_now, j.run,
       j.workflow_id, j.step, j.compensation, j.result, j.limit_group, j.trace_context,
       j.run_id, j.suspended_for, j.parent_id
  FROM atlantis.jobs j;
