-- Handler steps (issue 34): the statements a run's child sends on its handler's connection
-- (the functions are in live/steps.sql: fenced on the run id, SECURITY DEFINER), and the
-- operators' reads. Loaded by atlantis/store/queries.py.

-- name: step_records
SELECT name, kind, value FROM atlantis.step_records(%(job_id)s, %(run_id)s)

-- name: step_record
-- A step's record; in a transaction step the last statement, pipelined with the COMMIT.
SELECT atlantis.record_step(%(job_id)s, %(run_id)s, %(name)s, %(kind)s, %(value)s::jsonb,
                            %(attempt)s)

-- name: step_sleep
SELECT wake, due FROM atlantis.step_sleep(%(job_id)s, %(run_id)s, %(name)s,
                                         %(seconds)s::float8, %(until)s::timestamptz,
                                         %(attempt)s)

-- name: step_session_reset
-- A child's step connection between two attempts: whatever an attempt's code set on the
-- session (settings, a role, temporary tables, sequences' state, LISTENs, advisory locks,
-- cursors) is not the next one's. What DISCARD ALL does, but DEALLOCATE ALL: the statements
-- psycopg prepared stay valid (DISCARD ALL dropped them under its cache, which then named a
-- statement the server no longer had). Several commands: sent without parameters, in one
-- simple query.
RESET ALL; RESET SESSION AUTHORIZATION; DISCARD TEMP; DISCARD SEQUENCES; UNLISTEN *; SELECT pg_advisory_unlock_all(); CLOSE ALL

-- name: step_clear
SELECT atlantis.clear_steps(%(job_id)s)

-- name: queue_asleep
-- The metrics of durable waits, per served queue, in one round trip: rows (`what`, queue,
-- label, count). `suspended`: jobs suspended, labelled with what they wait for (`sleep`,
-- `event`, `join`: suspended_for up to its colon; by jobs_suspended_idx); `events`: the
-- events the database keeps for the queue's jobs, `pending` or `delivered`; `children`:
-- the children (spawned jobs) it keeps, by state (by jobs_children_idx).
SELECT 'suspended' AS what, queue, split_part(suspended_for, ':', 1) AS label, count(*)
  FROM atlantis.jobs
 WHERE state = 'available' AND suspended_for IS NOT NULL AND queue = ANY(%(queues)s::text[])
 GROUP BY 2, 3
UNION ALL
SELECT 'events', j.queue, CASE WHEN e.consumed_at IS NULL THEN 'pending' ELSE 'delivered' END,
       count(*)
  FROM atlantis.job_events e JOIN atlantis.jobs j ON j.id = e.job_id
 WHERE j.queue = ANY(%(queues)s::text[])
 GROUP BY 2, 3
UNION ALL
SELECT 'children', queue, state, count(*) FROM atlantis.jobs
 WHERE parent_id IS NOT NULL AND queue = ANY(%(queues)s::text[])
 GROUP BY 2, 3

-- name: step_list
-- A job's records, oldest first (`tide job steps`, the console).
SELECT name, kind, value::text AS value, bytes, attempt, recorded_at
  FROM atlantis.job_steps
 WHERE job_id = %(job_id)s
 ORDER BY recorded_at, name
 LIMIT %(limit)s

-- name: step_summary
-- How many records a job has, their bytes, and the last few (`tide job status`).
SELECT count(*) AS records, coalesce(sum(bytes), 0)::bigint AS bytes,
       coalesce((SELECT jsonb_agg(jsonb_build_object('name', l.name, 'kind', l.kind,
                                                     'bytes', l.bytes, 'at', l.recorded_at)
                                  ORDER BY l.recorded_at, l.name)
                   FROM (SELECT s.name, s.kind, s.bytes, s.recorded_at FROM atlantis.job_steps s
                          WHERE s.job_id = %(job_id)s
                          ORDER BY s.recorded_at DESC, s.name DESC LIMIT %(last)s) l),
                '[]'::jsonb) AS last
  FROM atlantis.job_steps
 WHERE job_id = %(job_id)s
