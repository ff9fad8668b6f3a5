-- ---- Views: what tide, the console and operators read -------------------------------------
--
-- The live definition of each view, replaced like the functions (CREATE OR REPLACE VIEW).
-- A view's columns are its contract (CONTRACT §9; older releases read them): this file may
-- change how a column is computed, never the columns themselves. A new column is appended by
-- a migration first (docs/upgrading.md); migrate refuses this file when it would change a
-- view's columns.

-- Every column of atlantis.jobs as tide, the listings and the console show it: intervals in
-- seconds, the stall threshold and whether the job is stalled, the server's clock, the trace
-- context (made by migration 0009; columns appended by 0013, 0017, 0018, 0019, 0026 and 0028).
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

-- The workflow instances as operators read them (CONTRACT §9; made by migration 0017, the
-- dismissal appended by 0022).
CREATE OR REPLACE VIEW atlantis.workflows AS
SELECT w.id, w.workflow, w.args, w.state, w.created_at, w.finished_at, w.error,
       w.failed_step, w.cause, w.deadline, w.cancel_requested_at, w.cancelled_by,
       w.retried_by, w.retried_at, w.dismissed_at, w.dismissed_by
  FROM atlantis.workflow_instances w;
