-- Children (issue 35): a handler's spawn and join (on its run's step connection, fenced),
-- the rescue's sweep, and what operators read. Loaded by atlantis/store/queries.py; the
-- functions are in live/children.sql.

-- name: step_spawn
SELECT child, fresh
  FROM atlantis.step_spawn(%(job_id)s, %(run_id)s, %(name)s, %(attempt)s, %(job)s,
                           %(args)s, %(run_at)s, %(priority)s, %(queue)s, %(delay)s,
                           %(trace_context)s)

-- name: step_spawn_many
SELECT child, fresh
  FROM atlantis.step_spawn_many(%(job_id)s, %(run_id)s, %(name)s, %(attempt)s, %(job)s,
                                %(args)s::jsonb[], %(run_at)s, %(priority)s, %(queue)s,
                                %(delay)s, %(trace_context)s)

-- name: step_join
SELECT id, state, result, error
  FROM atlantis.step_join(%(job_id)s, %(run_id)s, %(name)s, %(attempt)s,
                          %(ids)s::bigint[], %(results)s)

-- name: join_sweep
SELECT atlantis.join_sweep(%(limit)s)

-- name: job_children
-- A job's children by state (`tide job status`, the console), by jobs_children_idx.
SELECT state, count(*) AS n FROM atlantis.jobs
 WHERE parent_id = %(job_id)s
 GROUP BY state

-- name: job_children_list
-- A job's children, oldest first (the console's job page).
SELECT id, job, state FROM atlantis.jobs
 WHERE parent_id = %(job_id)s
 ORDER BY id
 LIMIT %(limit)s
