-- The statements of the public read API (atlantis.get_job, atlantis.list_jobs, atlantis.wait:
-- atlantis/jobs.py) and of `tide db server` (atlantis/cli/server.py), by name. Loaded with
-- queries.sql by atlantis/store/queries.py; the same rules hold: every value a parameter.
-- The jobs are read from the view atlantis.job_rows, which atlantis_reader may read.

-- name: api_job_get
-- The fields of atlantis.Job, in its order.
SELECT id, job, queue, args, state, attempt, max_attempts, priority, run, run_at, created_at,
       started_at, finished_at, progress_pct, progress_msg, result, last_error, error_count,
       workflow_id, step, compensation, parent_id, suspended_for, unique_key,
       cancel_requested_at, cancelled_by
  FROM atlantis.job_rows WHERE id = %(id)s

-- name: api_job_list
-- The same fields, newest first, of one queue, state and job when given.
SELECT id, job, queue, args, state, attempt, max_attempts, priority, run, run_at, created_at,
       started_at, finished_at, progress_pct, progress_msg, result, last_error, error_count,
       workflow_id, step, compensation, parent_id, suspended_for, unique_key,
       cancel_requested_at, cancelled_by
  FROM atlantis.job_rows
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(job)s::text IS NULL OR job = %(job)s)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: wait_listen
-- atlantis_finished: the ids of the jobs a statement ended (complete, dead, cancelled), a
-- comma list; empty when they did not fit in a payload: every waiter checks its job.
LISTEN atlantis_finished

-- name: wait_unlisten
UNLISTEN atlantis_finished

-- name: wait_state
SELECT state, result, last_error FROM atlantis.job_rows WHERE id = %(id)s

-- name: server_databases
-- `tide db server stop`: every database of the embedded server a session may use.
SELECT datname FROM pg_catalog.pg_database
 WHERE datallowconn AND NOT datistemplate ORDER BY datname

-- name: server_has_workers
SELECT to_regclass('atlantis.workers') IS NOT NULL AS found

-- name: server_supervisors
-- The supervisors whose row has not expired (as `tide worker list`).
SELECT id, host, pid FROM atlantis.workers WHERE expires_at > now() ORDER BY started_at
