-- The statements of the test kit (atlantis.testing: run_inline, drain, assert_idempotent,
-- wake), by name. Loaded with queries.sql by atlantis/store/queries.py; the same rules hold:
-- every value a parameter. They act on a test's own database only.

-- name: testing_prepare
-- A row run_inline claims next: its attempt as if `attempt - 1` had been spent, and room in
-- its budget for `attempt`.
UPDATE atlantis.jobs
   SET attempt = %(attempt)s - 1, max_attempts = greatest(max_attempts, %(attempt)s)
 WHERE id = %(id)s AND state = 'available'

-- name: testing_budget
-- assert_idempotent raises a job's attempt budget: each kill spends one attempt.
UPDATE atlantis.jobs SET max_attempts = max_attempts + %(more)s WHERE id = %(id)s

-- name: testing_wake
-- Suspended jobs (a durable sleep, a wait for an event, a join), of one job when `id` is
-- given, run now; with `retries`, so do rows waiting out a retry's backoff or a snooze. A
-- recorded sleep's wake time becomes now, so that the resumed run finds it due. Returns the
-- ids made due.
WITH woken AS (
UPDATE atlantis.jobs j
   SET run_at = now()
 WHERE j.state = 'available' AND j.run_at > now()
   AND (j.suspended_for IS NOT NULL OR %(retries)s::bool)
   AND (%(id)s::bigint IS NULL OR j.id = %(id)s)
RETURNING j.id
), slept AS (
UPDATE atlantis.job_steps s
   SET value = jsonb_build_object('until', now())
 WHERE s.kind = 'sleep' AND (s.value->>'until')::timestamptz > now()
   AND (%(id)s::bigint IS NULL OR s.job_id = %(id)s)
RETURNING s.job_id
)
SELECT id FROM woken UNION SELECT job_id FROM slept

-- name: testing_busy
-- Rows of `queues` still to run: running, or available and due.
SELECT count(*) FROM atlantis.jobs
 WHERE queue = ANY(%(queues)s::text[])
   AND (state = 'running' OR (state = 'available' AND run_at <= now()))

-- name: testing_ends
-- Each job of `queues` (or of `ids`) as drain and assert_idempotent report it, by id.
SELECT id, job, state, attempt, result, last_error
  FROM atlantis.jobs
 WHERE (queue = ANY(%(queues)s::text[]) OR id = ANY(%(ids)s::bigint[]))
 ORDER BY id
