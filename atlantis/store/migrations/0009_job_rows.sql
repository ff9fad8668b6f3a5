-- atlantis schema, version 9: one definition of a job as operators' tools read it.
-- Every column of atlantis.jobs (durations in seconds), the stall threshold and whether the
-- job is past it, and the database's clock (what ages are measured against). tide's
-- job_get/job_list and the console's pages select from it, so the list is written once.
-- A plain view: PostgreSQL inlines it, so filters and keyset ORDER BY id reach the table.

CREATE VIEW atlantis.job_rows AS
SELECT j.id, j.job, j.queue, j.args, j.state, j.attempt, j.max_attempts, j.priority, j.run_at,
       extract(epoch FROM j.timeout)::float8 AS timeout,
       extract(epoch FROM j.heartbeat)::float8 AS heartbeat,
       j.claimed_by, j.claimed_until, j.progress_pct, j.progress_msg, j.progress_at,
       j.last_error, j.errors, j.error_count, j.created_at, j.started_at, j.finished_at,
       extract(epoch FROM j.backoff)::float8 AS backoff, j.unique_key, j.cancel_requested_at,
       j.cancelled_by, j.retried_by, j.retried_at, j.progress_history,
       extract(epoch FROM atlantis.stall_after(j.job, j.heartbeat))::float8 AS stall_after,
       atlantis.stalled(j) AS stalled, now() AS db_now
  FROM atlantis.jobs j;

REVOKE ALL ON atlantis.job_rows FROM PUBLIC;
