-- Every statement atlantis runs at run time, by name. Loaded by atlantis/store/queries.py.
-- Writes made for an attempt after its claim are fenced on (id, attempt, claimed_by) and on
-- the row still running under a lease that has not expired.

-- name: enqueue_many
SELECT atlantis.enqueue_many(%(job)s, %(args)s::jsonb[], %(run_at)s, %(priority)s, %(queue)s,
                             %(delay)s)

-- name: sync_job_type
INSERT INTO atlantis.job_types (job, queue, max_attempts, priority, timeout, heartbeat, backoff,
                                unique_fields, fields, source, synced_at)
VALUES (%(job)s, %(queue)s, %(max_attempts)s, %(priority)s, make_interval(secs => %(timeout)s),
        make_interval(secs => %(heartbeat)s), make_interval(secs => %(backoff)s),
        %(unique_fields)s, %(fields)s, %(source)s, now())
ON CONFLICT (job) DO UPDATE SET
    queue = excluded.queue, max_attempts = excluded.max_attempts, priority = excluded.priority,
    timeout = excluded.timeout, heartbeat = excluded.heartbeat, backoff = excluded.backoff,
    unique_fields = excluded.unique_fields, fields = excluded.fields, source = excluded.source,
    synced_at = excluded.synced_at

-- name: claim
-- The CTE is a fence: PostgreSQL may re-run a LIMIT ... SKIP LOCKED subquery otherwise.
-- One index-ordered scan per queue (queue = one value, so jobs_fetch_idx returns rows in
-- order and the LIMIT stops it early); `queue = ANY(...)` would sort every waiting row.
WITH picked AS MATERIALIZED (
    SELECT j.id
      FROM unnest(%(queues)s::text[]) AS q(name)
     CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM atlantis.jobs
             WHERE state = 'available' AND queue = q.name AND run_at <= now()
               AND job = ANY(%(jobs)s::text[])
             ORDER BY priority, run_at, id
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED
           ) j
     ORDER BY j.priority, j.run_at, j.id
     LIMIT %(limit)s
)
UPDATE atlantis.jobs j
   SET state = 'running', attempt = j.attempt + 1, claimed_by = %(worker)s,
       claimed_until = now() + j.heartbeat, started_at = now(), cancel_requested_at = NULL
  FROM picked
 WHERE j.id = picked.id
RETURNING j.id, j.job, j.queue, j.args, j.attempt, j.max_attempts,
          extract(epoch FROM j.timeout)::float8 AS timeout,
          extract(epoch FROM j.heartbeat)::float8 AS heartbeat,
          now() + j.timeout AS deadline

-- name: touch
-- Heartbeat and checkpoint in one: extends every listed lease; rows with a progress value
-- also record it. Rows missing from the result have lost their lease.
UPDATE atlantis.jobs j
   SET claimed_until = now() + j.heartbeat,
       progress_pct = CASE WHEN r.has_progress THEN atlantis.clamp_pct(r.pct)
                           ELSE j.progress_pct END,
       progress_msg = CASE WHEN r.has_progress THEN left(r.msg, 256) ELSE j.progress_msg END,
       progress_at = CASE WHEN r.has_progress THEN now() ELSE j.progress_at END
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(has_progress)s::bool[],
              %(pcts)s::float8[], %(msgs)s::text[]) AS r(id, attempt, has_progress, pct, msg)
 WHERE j.id = r.id AND j.attempt = r.attempt AND j.claimed_by = %(worker)s
   AND j.state = 'running' AND j.claimed_until > now()
RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested

-- name: finish
-- The results of many attempts in one statement. outcome is one of complete, failed,
-- discard, snooze (no attempt spent), release (drained; no attempt spent), cancelled.
WITH r AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(outcomes)s::text[],
                         %(errors)s::jsonb[], %(delays)s::float8[], %(has_progress)s::bool[],
                         %(pcts)s::float8[], %(msgs)s::text[])
        AS r(id, attempt, outcome, error, delay, has_progress, pct, msg)
), cur AS (
    SELECT r.*,
           CASE WHEN r.outcome = 'complete' THEN 'complete'
                WHEN r.outcome = 'cancelled' THEN 'cancelled'
                WHEN r.outcome = 'discard' THEN 'dead'
                WHEN r.outcome IN ('snooze', 'release') THEN 'available'
                WHEN j.attempt >= j.max_attempts THEN 'dead'
                ELSE 'available' END AS next_state
      FROM atlantis.jobs j JOIN r ON j.id = r.id AND j.attempt = r.attempt
     WHERE j.claimed_by = %(worker)s AND j.state = 'running'
       FOR UPDATE OF j
)
UPDATE atlantis.jobs j
   SET state = cur.next_state,
       attempt = CASE WHEN cur.outcome IN ('snooze', 'release') THEN j.attempt - 1
                      ELSE j.attempt END,
       run_at = CASE WHEN cur.outcome = 'snooze' THEN now() + make_interval(secs => cur.delay)
                     WHEN cur.outcome = 'release' THEN now()
                     WHEN cur.next_state = 'available'
                          THEN now() + atlantis.retry_delay(j.backoff, j.attempt)
                     ELSE j.run_at END,
       claimed_until = NULL,
       finished_at = CASE WHEN cur.next_state IN ('complete', 'dead', 'cancelled') THEN now() END,
       progress_pct = CASE WHEN cur.has_progress THEN atlantis.clamp_pct(cur.pct)
                           ELSE j.progress_pct END,
       progress_msg = CASE WHEN cur.has_progress THEN left(cur.msg, 256) ELSE j.progress_msg END,
       progress_at = CASE WHEN cur.has_progress THEN now() ELSE j.progress_at END,
       last_error = CASE WHEN cur.error IS NULL THEN j.last_error ELSE cur.error->>'message' END,
       errors = CASE WHEN cur.error IS NULL THEN j.errors
                     ELSE j.errors || jsonb_build_array(cur.error || jsonb_build_object(
                          'at', now(), 'worker', j.claimed_by)) END
  FROM cur
 WHERE j.id = cur.id
RETURNING j.id, j.state

-- name: rescue
-- Rows whose lease expired: their worker is presumed dead. The attempt counts as failed and
-- the row is re-dispatched at once (or sent to dead). The WHERE clause is re-checked on the
-- locked row, so a row that completed meanwhile is left alone.
WITH expired AS MATERIALIZED (
    SELECT id FROM atlantis.jobs
     WHERE state = 'running' AND claimed_until < now()
     ORDER BY claimed_until
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE atlantis.jobs j
   SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
       run_at = now(),
       claimed_until = NULL,
       finished_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
       last_error = format('lease expired, worker %%s presumed dead', j.claimed_by),
       errors = j.errors || jsonb_build_array(jsonb_build_object(
           'attempt', j.attempt, 'kind', 'lease_expired',
           'message', format('lease expired, worker %%s presumed dead', j.claimed_by),
           'at', now(), 'worker', j.claimed_by, 'rescued_by', %(worker)s::text))
  FROM expired
 WHERE j.id = expired.id AND j.state = 'running' AND j.claimed_until < now()
RETURNING j.id, j.state, j.queue

-- name: worker_upsert
INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, in_flight, status, expires_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(in_flight)s, %(status)s,
        now() + make_interval(secs => %(ttl)s))
ON CONFLICT (id) DO UPDATE SET
    in_flight = excluded.in_flight, status = excluded.status, seen_at = now(),
    expires_at = excluded.expires_at

-- name: worker_delete
DELETE FROM atlantis.workers WHERE id = %(id)s OR expires_at < now() - interval '1 hour'

-- name: worker_list
SELECT id, host, pid, queues, concurrency, in_flight, status, started_at, seen_at
  FROM atlantis.workers WHERE expires_at > now() ORDER BY started_at

-- name: job_get
SELECT id, job, queue, args, state, attempt, max_attempts, priority, run_at,
       extract(epoch FROM timeout)::float8 AS timeout,
       extract(epoch FROM heartbeat)::float8 AS heartbeat,
       claimed_by, claimed_until, progress_pct, progress_msg, progress_at, last_error, errors,
       created_at, started_at, finished_at, cancel_requested_at, now() AS db_now
  FROM atlantis.jobs WHERE id = %(id)s

-- name: job_list
SELECT id, job, queue, state, attempt, max_attempts, priority, run_at, progress_pct,
       progress_msg, last_error, created_at, started_at, finished_at
  FROM atlantis.jobs
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: listen
LISTEN atlantis_jobs

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

-- name: release_orphans
-- Rows this supervisor run claimed but never received (the answer to a claim's COMMIT was
-- lost): no child runs them. Give them back at once without spending the attempt, rather
-- than let them wait for their lease to expire and be rescued as a failure.
UPDATE atlantis.jobs
   SET state = 'available', attempt = attempt - 1, run_at = now(), claimed_until = NULL
 WHERE claimed_by = %(worker)s AND state = 'running' AND NOT (id = ANY(%(known)s::bigint[]))
RETURNING id

-- name: queue_known
SELECT EXISTS (SELECT 1 FROM atlantis.job_types WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM atlantis.jobs WHERE queue = %(queue)s)
