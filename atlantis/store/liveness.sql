-- Liveness (issue 36): supervisors' marks of life, the silent ones, and the same-host rescue
-- of a supervisor that is provably gone (migration 0029). A worker row is *silent* when it
-- was not refreshed for two of its own liveness intervals, by the database's clock:
-- now() - seen_at > 2 * liveness_interval; a row of a release one behind (no interval) once
-- it expired. Every statement below spells that rule the same way.

-- name: worker_alive
-- The supervisor's mark of life, every liveness interval: seen_at, and the row's expiry
-- pushed on (never pulled in).
UPDATE atlantis.workers
   SET seen_at = now(),
       expires_at = greatest(expires_at, now() + make_interval(secs => %(ttl)s))
 WHERE id = %(id)s

-- name: worker_gone_candidates
-- Other supervisors that claim this host (same host name and boot id) and still hold running
-- rows: the same-host rescue looks at their lock files (atlantis/supervisor/identity.py).
SELECT w.id FROM atlantis.workers w
 WHERE w.host = %(host)s AND w.boot_id = %(boot_id)s AND w.id <> %(id)s
   AND EXISTS (SELECT 1 FROM atlantis.jobs j
                WHERE j.state = 'running' AND j.claimed_by = w.id)
 ORDER BY w.started_at

-- name: rescue_gone
-- Fires jobs_workflow_advance (the workflow engine, live/workflows.sql) for a step's row.
SELECT id, state, queue FROM atlantis.rescue_gone(%(worker)s, %(rescuer)s, %(max_backoff)s)

-- name: job_holder
-- A running job's holder as the fleet sees it: whether its worker row is silent and since
-- when (seconds since its last mark of life), and how long its lease has left. No row: the
-- job is not running. A holder with no worker row (a supervisor of an earlier release whose
-- row was deleted) is not known to be silent: only its lease speaks for it.
SELECT j.claimed_by AS worker, w.id IS NOT NULL AS registered,
       w.liveness_interval,
       extract(epoch FROM now() - w.seen_at)::float8 AS seen_seconds,
       coalesce(CASE WHEN w.liveness_interval IS NULL THEN w.expires_at < now()
                ELSE now() - w.seen_at > make_interval(secs => 2 * w.liveness_interval) END,
                false) AS silent,
       extract(epoch FROM j.claimed_until - now())::float8 AS lease_left
  FROM atlantis.jobs j
  LEFT JOIN atlantis.workers w ON w.id = j.claimed_by
 WHERE j.id = %(id)s AND j.state = 'running'

-- name: job_list_orphaned
-- Running jobs whose holder is silent, newest first: the columns of atlantis.job_rows.
SELECT r.* FROM atlantis.job_rows r
  JOIN atlantis.workers w ON w.id = r.claimed_by
 WHERE r.state = 'running'
   AND (%(queue)s::text IS NULL OR r.queue = %(queue)s)
   AND CASE WHEN w.liveness_interval IS NULL THEN w.expires_at < now()
            ELSE now() - w.seen_at > make_interval(secs => 2 * w.liveness_interval) END
 ORDER BY r.id DESC
 LIMIT %(limit)s

-- name: doctor_silent_holders
-- Supervisors that hold running rows and are silent, with how many rows and when the last
-- of their leases ends: those rows wait for their leases (or a same-host rescue).
SELECT j.claimed_by AS worker, w.host, w.pid,
       extract(epoch FROM now() - w.seen_at)::float8 AS silent_seconds,
       count(*)::int AS jobs,
       extract(epoch FROM max(j.claimed_until) - now())::float8 AS last_lease_left
  FROM atlantis.jobs j
  JOIN atlantis.workers w ON w.id = j.claimed_by
 WHERE j.state = 'running'
   AND CASE WHEN w.liveness_interval IS NULL THEN w.expires_at < now()
            ELSE now() - w.seen_at > make_interval(secs => 2 * w.liveness_interval) END
 GROUP BY j.claimed_by, w.host, w.pid, w.seen_at
 ORDER BY j.claimed_by
 LIMIT %(limit)s
