-- The statements operators' tools (tide workflow, the console, the metrics) run to read
-- workflows, by name. Loaded with queries.sql by atlantis/store/queries.py; the same rules
-- hold: every value a parameter. Run only through atlantis/store/workflows.py (the metrics'
-- count also through atlantis/store/supervision.py). Starting, cancelling and retrying a
-- workflow, and every transition, are the SQL functions' (live/workflows.sql): not here.

-- name: workflow_get
-- One workflow (the view atlantis.workflows, migration 0017) and the database's clock,
-- which the steps' ages are measured against.
SELECT w.id, w.workflow, w.args, w.state, w.created_at, w.finished_at, w.error,
       w.failed_step, w.cause, w.deadline, w.cancel_requested_at, w.cancelled_by,
       w.dismissed_at, w.dismissed_by, now() AS db_now
  FROM atlantis.workflows w
 WHERE w.id = %(id)s

-- name: workflow_forward_steps
-- The graph of one workflow as stored at its start (`position`: its place in the
-- declaration), each step with its
-- row when it has one (a step gets its row once it became runnable; never, if the workflow
-- failed or was cancelled before).
SELECT s.step, s.ord AS position, s.job, s.after, s.compensate, s.job_id, false AS compensation,
       j.state, j.attempt, j.max_attempts, j.progress_pct, j.progress_msg, j.result,
       j.created_at, j.started_at, j.finished_at, j.last_error
  FROM atlantis.workflow_steps s
  LEFT JOIN atlantis.jobs j ON j.id = s.job_id
 WHERE s.workflow_id = %(id)s
 ORDER BY s.ord

-- name: workflow_compensation_steps
-- The compensations' rows of one workflow, in the order they were created (`step`: the
-- step each one undoes).
SELECT j.step, 0 AS position, j.job, ARRAY[]::text[] AS after, NULL::text AS compensate,
       j.id AS job_id, true AS compensation, j.state, j.attempt, j.max_attempts,
       j.progress_pct, j.progress_msg, j.result, j.created_at, j.started_at, j.finished_at,
       j.last_error
  FROM atlantis.jobs j
 WHERE j.workflow_id = %(id)s AND j.compensation
 ORDER BY j.id

-- name: workflow_list
-- The newest workflows first (below id `before` when given, for the next page), in
-- `state` when given, with how many of their steps there are and how many completed.
SELECT w.id, w.workflow, w.args, w.state, w.created_at, w.finished_at, w.error,
       w.failed_step, w.cause,
       (SELECT count(*)::int FROM atlantis.workflow_steps s WHERE s.workflow_id = w.id)
           AS steps,
       (SELECT count(*)::int FROM atlantis.workflow_steps s
          JOIN atlantis.jobs j ON j.id = s.job_id
         WHERE s.workflow_id = w.id AND j.state = 'complete') AS steps_complete
  FROM atlantis.workflows w
 WHERE (%(state)s::text IS NULL OR w.state = %(state)s)
   AND (%(before)s::bigint IS NULL OR w.id < %(before)s)
 ORDER BY w.id DESC
 LIMIT %(limit)s

-- name: workflow_counts
-- How many workflows are in each of `states`, each count at most `cap`: through the index
-- on (state, id), a count costs at most `cap` index entries however many finished
-- workflows are kept (the metrics read it every few seconds on every supervisor).
SELECT s.state,
       (SELECT count(*)::int
          FROM (SELECT 1 FROM atlantis.workflow_instances w
                 WHERE w.state = s.state LIMIT %(cap)s) AS capped) AS count
  FROM unnest(%(states)s::text[]) AS s(state)
