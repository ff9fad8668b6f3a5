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
-- args as text: the supervisor passes them to the child untouched; the child decodes them.
RETURNING j.id, j.job, j.queue, j.args::text AS args, j.attempt, j.max_attempts,
          extract(epoch FROM j.timeout)::float8 AS timeout,
          extract(epoch FROM j.heartbeat)::float8 AS heartbeat,
          extract(epoch FROM j.backoff)::float8 AS backoff,
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
-- The results of many attempts in one statement. The next state of each row was decided
-- by the supervisor (atlantis.supervisor.policy); this statement only applies it, fenced on
-- the attempt still owning its row. `spent` false (a snooze, a drained attempt) gives the
-- attempt back; `delay` is when an available row may run again.
WITH r AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::text[],
                         %(spent)s::bool[], %(delays)s::float8[], %(errors)s::jsonb[],
                         %(has_progress)s::bool[], %(pcts)s::float8[], %(msgs)s::text[])
        AS r(id, attempt, state, spent, delay, error, has_progress, pct, msg)
), cur AS (
    SELECT r.*
      FROM atlantis.jobs j JOIN r ON j.id = r.id AND j.attempt = r.attempt
     WHERE j.claimed_by = %(worker)s AND j.state = 'running'
       FOR UPDATE OF j
)
UPDATE atlantis.jobs j
   SET state = cur.state,
       attempt = CASE WHEN cur.spent THEN j.attempt ELSE j.attempt - 1 END,
       run_at = CASE WHEN cur.state = 'available' THEN now() + make_interval(secs => cur.delay)
                     ELSE j.run_at END,
       claimed_until = NULL,
       finished_at = CASE WHEN cur.state IN ('complete', 'dead', 'cancelled') THEN now() END,
       progress_pct = CASE WHEN cur.has_progress THEN atlantis.clamp_pct(cur.pct)
                           ELSE j.progress_pct END,
       progress_msg = CASE WHEN cur.has_progress THEN left(cur.msg, 256) ELSE j.progress_msg END,
       progress_at = CASE WHEN cur.has_progress THEN now() ELSE j.progress_at END,
       last_error = CASE WHEN cur.error IS NULL THEN j.last_error ELSE cur.error->>'message' END,
       error_count = j.error_count + CASE WHEN cur.error IS NULL THEN 0 ELSE 1 END,
       errors = CASE WHEN cur.error IS NULL THEN j.errors
                     ELSE atlantis.errors_append(j.errors, cur.error || jsonb_build_object(
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
       error_count = j.error_count + 1,
       errors = atlantis.errors_append(j.errors, jsonb_build_object(
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

-- name: listen
LISTEN atlantis_jobs

-- name: release_orphans
-- Rows this supervisor run claimed but never received (the answer to a claim's COMMIT was
-- lost): no child runs them. Give them back at once without spending the attempt, rather
-- than let them wait for their lease to expire and be rescued as a failure.
UPDATE atlantis.jobs
   SET state = 'available', attempt = attempt - 1, run_at = now(), claimed_until = NULL
 WHERE claimed_by = %(worker)s AND state = 'running' AND NOT (id = ANY(%(known)s::bigint[]))
RETURNING id

-- name: attempt_state
-- After a result was sent on a connection that broke: did that write land?
SELECT state, attempt, claimed_by FROM atlantis.jobs WHERE id = %(id)s
