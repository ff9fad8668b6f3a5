-- The statements of operators' tools (tide, the console), by name. Loaded with
-- queries.sql by atlantis/store/queries.py; the same rules hold: every value a parameter.
-- Run only through atlantis/store/admin.py, which reads every row into a dataclass: each
-- column a statement returns is a field there, by name.

-- name: worker_list
SELECT id, host, pid, queues, concurrency, in_flight, status, started_at, seen_at
  FROM atlantis.workers WHERE expires_at > now() ORDER BY started_at

-- name: job_get
SELECT id, job, queue, args, state, attempt, max_attempts, priority, run_at,
       extract(epoch FROM timeout)::float8 AS timeout,
       extract(epoch FROM heartbeat)::float8 AS heartbeat,
       claimed_by, claimed_until, progress_pct, progress_msg, progress_at, last_error, errors,
       error_count, created_at, started_at, finished_at, cancel_requested_at, now() AS db_now
  FROM atlantis.jobs WHERE id = %(id)s

-- name: job_list
SELECT id, job, queue, state, attempt, max_attempts, priority, run_at, progress_pct,
       progress_msg, last_error, created_at, started_at, finished_at
  FROM atlantis.jobs
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: job_retry
UPDATE atlantis.jobs
   SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
       claimed_by = NULL, claimed_until = NULL, cancel_requested_at = NULL
 WHERE id = %(id)s AND state IN ('dead', 'cancelled')
RETURNING id, queue

-- name: job_cancel
-- Waiting jobs are cancelled at once; a running attempt is flagged and its supervisor stops
-- it (ctx.cancelled, SIGTERM, SIGKILL after the grace).
UPDATE atlantis.jobs
   SET state = CASE WHEN state = 'available' THEN 'cancelled' ELSE state END,
       finished_at = CASE WHEN state = 'available' THEN now() ELSE finished_at END,
       cancel_requested_at = CASE WHEN state = 'running' THEN now() ELSE cancel_requested_at END
 WHERE id = %(id)s AND state IN ('available', 'running')
RETURNING id, state

-- name: notify_queue
SELECT pg_notify('atlantis_jobs', %(queue)s)

-- name: queue_stats
SELECT queue,
       count(*) FILTER (WHERE state = 'available') AS available,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'complete') AS complete,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'available' AND run_at <= now()))::float8
           AS oldest_waiting_seconds,
       count(*) FILTER (WHERE state = 'complete' AND finished_at > now() - interval '1 minute')
           AS completed_last_minute
  FROM atlantis.jobs
 GROUP BY queue
 ORDER BY queue

-- name: queue_known
SELECT EXISTS (SELECT 1 FROM atlantis.job_types WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM atlantis.jobs WHERE queue = %(queue)s) AS known
