-- The statements of operators' tools (tide, the console), by name. Loaded with
-- queries.sql by atlantis/store/queries.py; the same rules hold: every value a parameter.
-- Run only through atlantis/store/admin.py (and atlantis/operations.py), which read every
-- row into a dataclass: each column a statement returns is a field there, by name.
-- Changes go through the SQL functions of migration 0005 (atlantis.cancel, retry, pause,
-- resume), one implementation for every path.

-- name: schema_version
-- Raises UndefinedTable (or InvalidSchemaName) when the schema was never created.
SELECT max(version) AS version FROM atlantis.schema_migrations

-- name: worker_list
-- Live supervisors, and expired ones that still hold running rows (migration 0029: shown
-- silent until the rows are rescued). silent_for: seconds since the last mark of life of a
-- silent one (liveness.sql says when a row is silent), NULL while it is not.
-- name, order_action, ordered_by, ordered_at (migration 0032): the supervisor's name and the
-- operator's order kept for it (orders.sql), if any.
SELECT w.id, host, pid, queues, concurrency, in_flight, status, jobs, job_types, started_at,
       seen_at, expires_at, now() AS db_now, liveness_interval,
       CASE WHEN CASE WHEN liveness_interval IS NULL THEN expires_at < now()
                      ELSE now() - seen_at > make_interval(secs => 2 * liveness_interval) END
            THEN extract(epoch FROM now() - seen_at)::float8 END AS silent_for,
       w.name, o.action AS order_action, o.asked_by AS ordered_by, o.asked_at AS ordered_at
  FROM atlantis.workers w
  LEFT JOIN atlantis.worker_orders o ON o.name = w.name
 WHERE expires_at > now()
    OR EXISTS (SELECT 1 FROM atlantis.jobs j WHERE j.state = 'running' AND j.claimed_by = w.id)
 ORDER BY started_at

-- name: job_get
-- atlantis.job_rows (migration 0009): every column of atlantis.jobs, the stall threshold,
-- whether the job is past it, and the database's clock.
SELECT * FROM atlantis.job_rows WHERE id = %(id)s

-- name: job_list
-- The same columns as job_get, newest first.
SELECT * FROM atlantis.job_rows
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
   AND (NOT %(stalled)s OR (state = 'running' AND stalled))
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: job_attempts
-- The timeline: every attempt of a job that ended, oldest first, with its run (1, then one
-- more after each retry: attempts count from 1 again in each run).
SELECT id, run, attempt, worker, host, pid, child_pid, started_at, finished_at, outcome, error_kind,
       log_lines, log_dropped, warning
  FROM atlantis.attempts WHERE job_id = %(job_id)s ORDER BY id

-- name: job_retry
-- `fresh`: the job's handler step records are dropped with the retry (migration 0026), in
-- the same statement; otherwise its next run resumes from them.
WITH r AS MATERIALIZED (
    SELECT atlantis.retry(%(id)s, coalesce(%(by)s::text, current_user::text)) AS id
)
SELECT r.id, CASE WHEN %(fresh)s::boolean AND r.id IS NOT NULL
                  THEN atlantis.clear_steps(r.id) END AS cleared
  FROM r

-- name: workflow_start
-- Workflows (migration 0017): in the caller's transaction, as an enqueue.
-- trace_context: the starter's W3C trace context (atlantis.tracing), NULL when none; every
-- step's row gets it.
SELECT atlantis.start_workflow(%(name)s, %(args)s::jsonb, %(trace_context)s::jsonb) AS id

-- name: workflow_cancel
SELECT atlantis.cancel_workflow(%(id)s, coalesce(%(by)s::text, current_user::text)) AS state

-- name: workflow_retry
SELECT atlantis.retry_workflow(%(id)s, coalesce(%(by)s::text, current_user::text)) AS state

-- name: workflow_dismiss
-- Migration 0022: a compensation_failed workflow's owed undo given up, its unique key freed.
SELECT atlantis.dismiss_workflow(%(id)s, coalesce(%(by)s::text, current_user::text)) AS state

-- name: job_cancel
-- Waiting jobs are cancelled at once; a running attempt is flagged and its supervisor told
-- (ctx.cancelled, then SIGTERM after the cancel grace); the job ends cancelled.
SELECT atlantis.cancel(%(id)s, coalesce(%(by)s::text, current_user::text)) AS state

-- name: operator_pause
SELECT atlantis.pause(%(queue)s, %(reason)s, coalesce(%(by)s::text, current_user::text)) AS changed

-- name: operator_resume
SELECT atlantis.resume(%(queue)s, coalesce(%(by)s::text, current_user::text)) AS changed

-- name: operator_prune
-- Finished jobs older than `older_than` (with their attempts and logs), `batch` at a time:
-- atlantis.prune comes with the retention migration.
SELECT atlantis.prune(%(older_than)s::interval, %(states)s::text[], %(batch)s) AS deleted

-- name: job_log_lines
-- One attempt's output after line `after` (ids grow as lines are written); an attempt is
-- (run, attempt).
SELECT id, run, attempt, at, stream, line
  FROM atlantis.logs
 WHERE job_id = %(job_id)s AND run = %(run)s AND attempt = %(attempt)s AND id > %(after)s
 ORDER BY id
 LIMIT %(limit)s

-- name: job_log_attempt
-- The attempt that wrote a job's newest log line, of run `run` when given, and its run.
SELECT run, attempt FROM atlantis.logs
 WHERE job_id = %(job_id)s AND (%(run)s::int IS NULL OR run = %(run)s)
 ORDER BY id DESC LIMIT 1

-- name: job_run_attempts
-- How many attempts run `run` of a job has had, by its timeline and its log lines (the
-- running attempt is the job row's).
SELECT greatest((SELECT max(a.attempt) FROM atlantis.attempts a
                  WHERE a.job_id = %(job_id)s AND a.run = %(run)s),
                (SELECT max(l.attempt) FROM atlantis.logs l
                  WHERE l.job_id = %(job_id)s AND l.run = %(run)s)) AS attempts

-- name: queue_stats
-- Every queue anything names (declarations, jobs, an operator's pause, a live supervisor),
-- with its counts by state, pause, live supervisors, `unserved_jobs`: the job types of due
-- jobs that no live supervisor of the queue handles (a supervisor's `job_types`, migration
-- 0014; NULL, from an earlier release: every job), and `unserved`: due jobs wait and no live
-- supervisor serves the queue, or some of them are of such a type. `unserved_jobs` looks at
-- the first `sample` due jobs in claim order (jobs_fetch_free_idx): rows nobody claims stay at
-- the head of that order while the others are claimed; and `sample` due rows of limited
-- jobs (jobs_limited_idx), which the claim takes group by group. Counts come from atlantis.queue_counts: exact up to
-- `cap` rows per queue and state, the planner's estimate beyond (listed in `approximate`),
-- so this stays cheap on millions of rows. Completions are counted over the last hour's
-- rows only (jobs_finished_idx).
WITH live AS (
    SELECT queues, job_types FROM atlantis.workers WHERE expires_at > now()
), counts AS (
    SELECT c.queue,
           max(c.n) FILTER (WHERE c.state = 'available') AS available,
           max(c.n) FILTER (WHERE c.state = 'due') AS due,
           max(c.n) FILTER (WHERE c.state = 'running') AS running,
           max(c.n) FILTER (WHERE c.state = 'complete') AS complete,
           max(c.n) FILTER (WHERE c.state = 'dead') AS dead,
           max(c.n) FILTER (WHERE c.state = 'cancelled') AS cancelled,
           array_agg(c.state ORDER BY c.state) FILTER (WHERE NOT c.exact) AS approximate
      FROM atlantis.queue_counts(%(cap)s) c
     GROUP BY c.queue
), stalled AS (
    SELECT j.queue, count(*) AS stalled
      FROM atlantis.jobs j
     WHERE j.state = 'running' AND atlantis.stalled(j)
     GROUP BY j.queue
), recent AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.finished_at > now() - interval '1 minute')
               AS completed_last_minute,
           count(*) AS completed_last_hour
      FROM atlantis.jobs j
     WHERE j.finished_at > now() - interval '1 hour' AND j.state = 'complete'
     GROUP BY j.queue
), names AS (
    SELECT queue AS name FROM atlantis.job_types
    UNION SELECT queue FROM counts
    UNION SELECT name FROM atlantis.queues
    UNION SELECT unnest(queues) FROM live
)
SELECT n.name AS queue,
       coalesce(c.available, 0) AS available, coalesce(c.due, 0) AS due,
       coalesce(c.running, 0) AS running, coalesce(s.stalled, 0) AS stalled,
       coalesce(c.complete, 0) AS complete, coalesce(c.dead, 0) AS dead,
       coalesce(c.cancelled, 0) AS cancelled,
       CASE WHEN coalesce(c.due, 0) > 0
            THEN extract(epoch FROM now() - atlantis.oldest_due(n.name))::float8 END
           AS oldest_waiting_seconds,
       coalesce(r.completed_last_minute, 0) AS completed_last_minute,
       coalesce(r.completed_last_hour, 0) AS completed_last_hour,
       coalesce(q.paused, false) AS paused, q.reason AS paused_reason,
       q.changed_by AS paused_by, q.changed_at AS paused_at,
       EXISTS (SELECT 1 FROM atlantis.job_types t WHERE t.queue = n.name) AS declared,
       (SELECT count(*) FROM live WHERE n.name = ANY(live.queues)) AS supervisors,
       coalesce(c.due, 0) > 0
           AND (NOT EXISTS (SELECT 1 FROM live WHERE n.name = ANY(live.queues))
                OR cardinality(u.jobs) > 0) AS unserved,
       coalesce(c.approximate, '{}') AS approximate,
       u.jobs AS unserved_jobs
  FROM names n
  LEFT JOIN counts c ON c.queue = n.name
  CROSS JOIN LATERAL (
        SELECT CASE WHEN coalesce(c.due, 0) = 0 THEN '{}'::text[] ELSE ARRAY(
            SELECT DISTINCT h.job
              FROM ((SELECT j.job FROM atlantis.jobs j
                      WHERE j.state = 'available' AND j.limit_group IS NULL
                        AND j.queue = n.name AND j.run_at <= now()
                      ORDER BY j.priority, j.run_at, j.id
                      LIMIT %(sample)s)
                    UNION ALL
                    (SELECT j.job FROM atlantis.jobs j
                      WHERE j.state = 'available' AND j.limit_group IS NOT NULL
                        AND j.queue = n.name AND j.run_at <= now()
                      LIMIT %(sample)s)) h
             WHERE NOT EXISTS (SELECT 1 FROM live
                                WHERE n.name = ANY(live.queues)
                                  AND (live.job_types IS NULL OR h.job = ANY(live.job_types)))
             ORDER BY h.job) END AS jobs
       ) u
  LEFT JOIN stalled s ON s.queue = n.name
  LEFT JOIN recent r ON r.queue = n.name
  LEFT JOIN atlantis.queues q ON q.name = n.name
 ORDER BY n.name

-- name: queue_known
-- A queue anything names: a declaration, a job, an operator's pause, a live supervisor.
SELECT EXISTS (SELECT 1 FROM atlantis.job_types WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM atlantis.jobs WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM atlantis.queues WHERE name = %(queue)s)
    OR EXISTS (SELECT 1 FROM atlantis.workers WHERE %(queue)s = ANY(queues)) AS known

-- name: job_served
-- Whether a live supervisor (its row not expired) serves the queue and the job type, as
-- queue_stats' `unserved_jobs` decides it (`job_types` NULL: a supervisor of an earlier
-- release, which serves every job of its queues).
SELECT EXISTS (SELECT 1 FROM atlantis.workers w
                WHERE w.expires_at > now() AND %(queue)s = ANY(w.queues)
                  AND (w.job_types IS NULL OR %(job)s = ANY(w.job_types))) AS known

-- name: queue_served
-- A queue a declaration names or some supervisor has served (a registered one, or a job of
-- it that was ever claimed). Enqueueing anywhere else is probably a typo.
SELECT EXISTS (SELECT 1 FROM atlantis.job_types WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM atlantis.workers WHERE %(queue)s = ANY(queues))
    OR EXISTS (SELECT 1 FROM atlantis.jobs
                WHERE state IN ('running', 'complete', 'dead', 'cancelled')
                  AND queue = %(queue)s AND started_at IS NOT NULL) AS known
