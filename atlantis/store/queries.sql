-- Every statement atlantis runs at run time, by name. Loaded by atlantis/store/queries.py.
-- Writes made for an attempt after its claim are fenced on (id, run, attempt, claimed_by), on
-- the claim's run id (migration 0026: a resume spends no attempt, so the others may repeat
-- across two claims of a row; a caller that passes none is fenced on the rest) and on the row
-- still running under a lease that has not expired. The run (migration 0013) tells run 2's
-- attempt 1 from run 1's after a retry, even when one supervisor claimed both.

-- name: enqueue_many
-- The args go in binary (`%(args)b`): PostgreSQL then reads the array without parsing and
-- unescaping its text form, 1.7 ms for 1,000 args instead of 7 to 8.
-- trace_context: the enqueuer's W3C trace context (atlantis.tracing), NULL when none.
SELECT atlantis.enqueue_many(%(job)s, %(args)b::jsonb[], %(run_at)s, %(priority)s, %(queue)s,
                             %(delay)s, %(trace_context)s::jsonb)

-- name: sync_job_type
-- Returns whether the job's limits changed: its rows are then marked anew (limit_mark).
-- overlap: migration 0033 (a release one behind leaves it as this one stored it).
WITH was AS (SELECT t.limits FROM atlantis.job_types t WHERE t.job = %(job)s)
INSERT INTO atlantis.job_types AS t (job, queue, max_attempts, priority, timeout, heartbeat,
                                     backoff, unique_fields, fields, source, synced_at, stall,
                                     schedule, tz, limits, overlap)
VALUES (%(job)s, %(queue)s, %(max_attempts)s, %(priority)s, make_interval(secs => %(timeout)s),
        make_interval(secs => %(heartbeat)s), make_interval(secs => %(backoff)s),
        %(unique_fields)s, %(fields)s, %(source)s, now(),
        make_interval(secs => %(stall)s::double precision), %(schedule)s, %(tz)s, %(limits)s,
        %(overlap)s)
ON CONFLICT (job) DO UPDATE SET
    queue = excluded.queue, max_attempts = excluded.max_attempts, priority = excluded.priority,
    timeout = excluded.timeout, heartbeat = excluded.heartbeat, backoff = excluded.backoff,
    unique_fields = excluded.unique_fields, fields = excluded.fields, source = excluded.source,
    synced_at = excluded.synced_at, stall = excluded.stall, schedule = excluded.schedule,
    tz = excluded.tz, limits = excluded.limits, overlap = excluded.overlap
RETURNING t.limits IS DISTINCT FROM coalesce((SELECT was.limits FROM was), '[]'::jsonb)
          AS limits_changed

-- name: limit_mark
SELECT atlantis.limit_mark(%(job)s)

-- name: claim
-- The limit veto (trigger jobs_limit_claim, live/limits.sql) runs for a limited row it marks.
-- Up to `limit` due rows no limit applies to, for `worker` (atlantis.claim, migration 0020:
-- the statement, with its plan made once a session). `limited`: the jobs declaring limits.
-- One statement, no BEGIN ... COMMIT: atlantis.claim_in_time, read once the claim is made
-- (its function returns every row at once), rolls it back whole when it ran past %(within)s
-- seconds from the statement's start.
WITH c AS MATERIALIZED (
    SELECT * FROM atlantis.claim(%(queues)s::text[], %(jobs)s::text[], %(worker)s::text,
                                 %(limit)s::int, %(limited)s::text[])
)
SELECT id, job, queue, args, run, attempt, max_attempts, cancel_requested, timeout,
       heartbeat, backoff, deadline, workflow_id, workflow, trace_context,
       run_id::text AS run_id  -- text: the supervisor only passes it on, as text
  FROM c
 WHERE (SELECT atlantis.claim_in_time(statement_timestamp()
                                      + make_interval(secs => %(within)s::float8))
          FROM c LIMIT 1)

-- name: claim_limited
-- Rows of limited jobs, for idle children only (atlantis.claim_limited); the last row has a
-- NULL id and says when to try again (wake_in, seconds) and where the next call starts
-- (cursor, passed back as `after`); read by column name. The enqueuer's trace context is
-- read here. The limit veto (trigger jobs_limit_claim) runs inside it, for each row it claims.
-- One statement, no BEGIN ... COMMIT: atlantis.claim_in_time, read once the claim is made
-- (its function returns every row at once), rolls it back whole when it ran past %(within)s
-- seconds from the statement's start.
WITH c AS MATERIALIZED (
    SELECT * FROM atlantis.claim_limited(%(queues)s::text[], %(jobs)s::text[], %(worker)s,
                                         %(limit)s, %(after)s)
)
SELECT c.id, c.job, c.queue, c.args, c.run, c.attempt, c.max_attempts, c.cancel_requested,
       c.timeout, c.heartbeat, c.backoff, c.deadline, c.workflow_id, c.workflow,
       (SELECT j.trace_context FROM atlantis.jobs j WHERE j.id = c.id) AS trace_context,
       c.wake_in, c.cursor, c.run_id::text AS run_id
  FROM c
 WHERE (SELECT atlantis.claim_in_time(statement_timestamp()
                                      + make_interval(secs => %(within)s::float8))
          FROM c LIMIT 1)

-- name: claim_isolate
-- A claim failed on a row's data: the rows it would try, tried one by one; those whose
-- claim fails end dead, kind `claim` (atlantis.claim_isolate, migration 0021).
SELECT id, error
  FROM atlantis.claim_isolate(%(queues)s::text[], %(jobs)s::text[], %(worker)s::text,
                              %(limit)s::int, %(limited)s::text[], %(rejected)s::text[])

-- name: renew
-- Heartbeat and checkpoint in one: extends every listed lease; rows with a progress value
-- also record it, and sample it into progress_history (at most one sample a second, the
-- last 200). Rows missing from the result have lost their lease.
WITH r AS (
    -- One JSON array of renewals: one parameter, dumped by orjson and parsed in C (seven
    -- arrays cost the supervisor's Python more a tick than the statement costs the database:
    -- benchmarks/HISTORY.md, 2026-12-07, sixth).
    SELECT * FROM jsonb_to_recordset(%(renewals)s::jsonb)
        AS r(id bigint, run int, attempt int, run_id uuid, has_progress bool, pct float8,
             msg text)
), upd AS (
UPDATE atlantis.jobs j
   SET claimed_until = now() + j.heartbeat,
       progress_pct = CASE WHEN r.has_progress THEN atlantis.clamp_pct(r.pct)
                           ELSE j.progress_pct END,
       progress_msg = CASE WHEN r.has_progress THEN atlantis.progress_text(r.msg) ELSE j.progress_msg END,
       progress_at = CASE WHEN r.has_progress THEN now() ELSE j.progress_at END,
       progress_history = CASE
           WHEN NOT r.has_progress THEN j.progress_history
           WHEN jsonb_array_length(j.progress_history) > 0
                AND (j.progress_history->-1->>'at')::timestamptz > now() - interval '1 second'
                THEN j.progress_history
           WHEN jsonb_array_length(j.progress_history) >= 200
                THEN (j.progress_history - 0) || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'pct', atlantis.clamp_pct(r.pct)))
           ELSE j.progress_history || jsonb_build_array(jsonb_build_object(
                'at', now(), 'pct', atlantis.clamp_pct(r.pct))) END
  FROM r
 WHERE j.id = r.id
   -- By the key, as in `finish`: jsonb_to_recordset is always estimated at 100 rows, and
   -- joined on `id` alone a large table could be read whole.
   AND j.id = ANY(ARRAY(SELECT r.id FROM r))
   -- One boolean test, not several conditions: no index serves it, so the planner never
   -- looks rows up through the state or the lease index (statistics from when nothing was
   -- running had it scan every running row for each renewal; see `finish`).
   AND (j.run = r.run AND j.attempt = r.attempt AND j.claimed_by = %(worker)s
        AND (r.run_id IS NULL OR j.run_id = r.run_id)
        AND j.state = 'running' AND j.claimed_until > now()) IS TRUE
RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested,
          r.has_progress AND (j.progress_history->-1->>'at')::timestamptz = now() AS sampled
)
-- Watchers (the console) hear of new progress samples: a NOTIFY listing the jobs that got
-- a sample (at most one a second each), one per 300 of them (a payload holds 8000 bytes).
, note AS MATERIALIZED (
    SELECT count(*) AS sent FROM (
        SELECT pg_notify('atlantis_progress', json_agg(id)::text)
          FROM (SELECT id, (row_number() OVER ()) / 300 AS chunk FROM upd WHERE sampled) c
         GROUP BY chunk) g
)
SELECT upd.id, upd.cancel_requested FROM upd CROSS JOIN note

-- name: finish
-- Fires jobs_workflow_advance (the workflow engine, live/workflows.sql) for a step's row.
-- The results of many attempts in one statement. The next state of each row was decided
-- by the supervisor (atlantis.supervisor.policy); this statement only applies it, fenced on
-- the attempt still owning its row. `spent` false (a snooze, a drained attempt) gives the
-- attempt back; a suspended one (`suspend`: a handler's durable sleep) runs again at its
-- `wake` and says what it waits for (`waits`, the row's suspended_for; migration 0026);
-- an available row may run again after `backoff`, when it is given (the
-- job's backoff for this attempt, at most that many seconds: atlantis.retry_delay, the one
-- home of the retry delay), else after `delay` (a snooze). A cancel requested
-- meanwhile wins over whatever the attempt did: the row ends `cancelled`, and its text
-- names who cancelled (cancelled_by: the supervisor's own `cancelled` error only says that
-- an operator did). `result` (the handler's return value, checked by the supervisor) is
-- written only on a row that ends `complete`: a cancel that wins keeps it null. Each written
-- attempt is also recorded in atlantis.attempts (the timeline); it and every `errors` entry
-- carry the run.
WITH r AS (
    -- One JSON array of result objects: one parameter to send, parsed in C on both sides.
    SELECT * FROM jsonb_to_recordset(%(results)s::jsonb)
        AS r(id bigint, run int, attempt int, state text, spent bool, delay float8,
             backoff float8, error jsonb,
             has_progress bool, pct float8, msg text, label text, child_pid int,
             log_lines int, log_dropped int, result jsonb, wake timestamptz, waits text,
             run_id uuid, warning text)
), cur AS (
    SELECT r.*, j.started_at AS attempt_started,
           -- Cancelled, but not by this outcome's own cancelled error: append one.
           j.cancel_requested_at IS NOT NULL
               AND coalesce(r.error->>'kind', '') <> 'cancelled' AS cancelling,
           -- The outcome's error as written: with the run, and a `cancelled` one (the
           -- supervisor stopped the attempt for a cancel) the entry every cancel writes
           -- (atlantis.cancel_entry), naming who cancelled.
           CASE WHEN r.error IS NULL THEN NULL
                WHEN r.error->>'kind' = 'cancelled'
                THEN r.error || atlantis.cancel_entry(j.run, j.attempt, j.cancelled_by)
                ELSE r.error || jsonb_build_object('run', j.run) END AS err,
           CASE WHEN j.cancel_requested_at IS NOT NULL
                THEN atlantis.cancel_entry(j.run, j.attempt, j.cancelled_by) END AS cancel_error
      -- Row by row through the primary key, whatever the planner thinks of the JSON's size:
      -- joined the other way, every running row of this worker met every result (the
      -- rows of a backlog of results are still running: a batch cost grew with the backlog).
      -- The fence is one boolean test, not an index condition: with statistics taken while
      -- nothing was running, the planner looked each row up among all running rows by the
      -- state index (200 results among 2,000 running rows: 0.7 s; a drain at a fifth of
      -- its rate).
      FROM r CROSS JOIN LATERAL (
               SELECT * FROM atlantis.jobs j
                WHERE j.id = r.id
                  AND (j.run = r.run AND j.attempt = r.attempt AND j.claimed_by = %(worker)s
                       AND (r.run_id IS NULL OR j.run_id = r.run_id)
                       AND j.state = 'running') IS TRUE
                  FOR UPDATE) j
), done AS (
    UPDATE atlantis.jobs j
       SET state = CASE WHEN cur.cancelling THEN 'cancelled' ELSE cur.state END,
           attempt = CASE WHEN cur.spent OR cur.cancelling THEN j.attempt ELSE j.attempt - 1 END,
           run_at = CASE WHEN cur.state <> 'available' OR cur.cancelling THEN j.run_at
                         WHEN cur.wake IS NOT NULL THEN cur.wake  -- suspended: the wake time
                         WHEN cur.backoff IS NOT NULL
                         THEN now() + atlantis.retry_delay(j.backoff, j.attempt,
                                                           make_interval(secs => cur.backoff))
                         ELSE now() + make_interval(secs => cur.delay) END,
           claimed_until = NULL,
           suspended_for = CASE WHEN cur.state = 'available' AND NOT cur.cancelling
                                THEN cur.waits END,
           finished_at = CASE WHEN cur.cancelling OR cur.state IN ('complete', 'dead', 'cancelled')
                              THEN now() END,
           progress_pct = CASE WHEN cur.has_progress THEN atlantis.clamp_pct(cur.pct)
                               ELSE j.progress_pct END,
           progress_msg = CASE WHEN cur.has_progress THEN atlantis.progress_text(cur.msg) ELSE j.progress_msg END,
           progress_at = CASE WHEN cur.has_progress THEN now() ELSE j.progress_at END,
           result = CASE WHEN NOT cur.cancelling AND cur.state = 'complete' THEN cur.result
                         ELSE j.result END,
           last_error = CASE WHEN cur.cancelling THEN cur.cancel_error->>'message'
                             WHEN cur.err IS NULL THEN j.last_error
                             ELSE cur.err->>'message' END,
           error_count = j.error_count + CASE WHEN cur.err IS NULL THEN 0 ELSE 1 END
                         + CASE WHEN cur.cancelling THEN 1 ELSE 0 END,
           errors = CASE WHEN cur.cancelling THEN atlantis.errors_append(
                             CASE WHEN cur.err IS NULL THEN j.errors
                                  ELSE atlantis.errors_append(j.errors, cur.err
                                       || jsonb_build_object('at', now(), 'worker', j.claimed_by))
                             END,
                             cur.cancel_error || jsonb_build_object('at', now(), 'worker', j.claimed_by))
                         WHEN cur.err IS NULL THEN j.errors
                         ELSE atlantis.errors_append(j.errors, cur.err || jsonb_build_object(
                              'at', now(), 'worker', j.claimed_by)) END
      FROM cur
     WHERE j.id = cur.id
       -- By the key, as in `claim`: jsonb_to_recordset is always estimated at 100 rows, so
       -- joined on `id` alone the rows were found by a scan of the whole table (2 ms a
       -- statement at 6,000 rows, 0.3 ms a job at batch 10: benchmarks/store_cycle.py).
       AND j.id = ANY(ARRAY(SELECT cur.id FROM cur))
    RETURNING j.id, j.state, j.run, j.attempt, cur.attempt_started, cur.label, cur.cancelling,
              cur.error->>'kind' AS error_kind, cur.child_pid, cur.log_lines, cur.log_dropped,
              cur.warning
), timeline AS (
    -- `warning` (migration 0030): what atlantis had to end that the attempt left running.
    INSERT INTO atlantis.attempts (job_id, run, attempt, worker, host, pid, child_pid,
                                   started_at, outcome, error_kind, log_lines, log_dropped,
                                   warning)
    SELECT done.id, done.run, done.attempt + CASE WHEN done.state = 'available' AND done.label IN
                                            ('snooze', 'release', 'suspend') THEN 1 ELSE 0 END,
           %(worker)s, %(host)s, %(pid)s, done.child_pid, done.attempt_started,
           CASE WHEN done.cancelling THEN 'cancelled' ELSE done.label END,
           CASE WHEN done.cancelling THEN 'cancelled' ELSE done.error_kind END,
           done.log_lines, done.log_dropped, left(done.warning, 4096)
      FROM done
     -- A row given back before any child ran it (claimed ahead) had no attempt.
     WHERE NOT (done.label = 'release' AND done.child_pid IS NULL)
), refund AS (
    -- A rate-limited row given back before any child ran it did not start: its windows
    -- forget it (atlantis.limit_claim recorded them at its started_at).
    DELETE FROM atlantis.limit_starts s USING done
     WHERE done.label = 'release' AND done.child_pid IS NULL
       AND s.job_id = done.id AND s.at = done.attempt_started
), note AS MATERIALIZED (
    -- Watchers (the console) hear which jobs changed state: a NOTIFY listing them, one per
    -- 300 (a payload holds 8000 bytes: one for a whole batch of 1,100 failed them all).
    SELECT count(*) AS sent FROM (
        SELECT pg_notify('atlantis_progress', json_agg(id)::text)
          FROM (SELECT id, (row_number() OVER ()) / 300 AS chunk FROM done) c
         GROUP BY chunk) g
), ended AS MATERIALIZED (
    -- atlantis.wait hears which jobs ended: one NOTIFY for the whole statement, the ids as a
    -- comma list, or empty ("check yours") when they do not fit in a payload (8000 bytes).
    SELECT count(*) AS sent FROM (
        SELECT pg_notify('atlantis_finished',
                         CASE WHEN octet_length(e.ids) < 8000 THEN e.ids ELSE '' END)
          FROM (SELECT string_agg(id::text, ',') AS ids FROM done
                 WHERE state IN ('complete', 'dead', 'cancelled')) e
         WHERE e.ids IS NOT NULL) g
)
SELECT done.id, done.state FROM done CROSS JOIN note CROSS JOIN ended

-- name: rescue
-- Fires jobs_workflow_advance (the workflow engine, live/workflows.sql) for a step's row.
-- Rows whose lease expired: their worker is presumed dead. atlantis.rescue_rows applies the
-- rescue's rule (live/liveness.sql: the attempt fails; the row goes back, to dead or to
-- cancelled; from the second expiry in a row on, after the job's backoff). The rows are
-- locked here, oldest lease first; the function re-checks that each is still running.
WITH expired AS MATERIALIZED (
    SELECT id FROM atlantis.jobs
     WHERE state = 'running' AND claimed_until < now()
     ORDER BY claimed_until
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
SELECT r.id, r.state, r.queue
  FROM atlantis.rescue_rows(ARRAY(SELECT id FROM expired), %(worker)s::text,
                            %(max_backoff)s::float8, false) r

-- name: workflow_sweep
-- Workflows past their deadline fail; cancels a race skipped are sent again (migration 0017).
SELECT atlantis.workflow_sweep(%(batch)s)

-- name: limit_sweep
-- Rate windows that ended are forgotten (migration 0018).
SELECT atlantis.limit_sweep(%(batch)s)

-- name: worker_upsert
-- job_types: the jobs it claims (they change with a reload; migration 0014). The liveness
-- interval and the host's boot id (migration 0029): liveness.sql. Its name (migration 0032):
-- what an operator's order is kept for (orders.sql).
INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, in_flight, status, expires_at,
                              jobs, job_types, liveness_interval, boot_id, name)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(in_flight)s, %(status)s,
        now() + make_interval(secs => %(ttl)s), %(jobs)s, %(job_types)s,
        %(liveness_interval)s, %(boot_id)s, %(name)s)
ON CONFLICT (id) DO UPDATE SET
    in_flight = excluded.in_flight, status = excluded.status, seen_at = now(),
    expires_at = excluded.expires_at, jobs = excluded.jobs, job_types = excluded.job_types

-- name: worker_delete
-- Rows expired an hour ago go too, unless their supervisor still holds running rows: those
-- stay, shown silent, until the rows are rescued (migration 0029).
DELETE FROM atlantis.workers w
 WHERE w.id = %(id)s
    OR (w.expires_at < now() - interval '1 hour'
        AND NOT EXISTS (SELECT 1 FROM atlantis.jobs j
                         WHERE j.state = 'running' AND j.claimed_by = w.id))

-- name: backend_pid
-- The pid of the server process serving this statement: behind a pooler it is not the one
-- the connection was told at start (atlantis.supervisor.pooler.behind_pooler).
SELECT pg_backend_pid()

-- name: listen
-- atlantis_jobs: a queue has new work. atlantis_control: cancel, pause, resume.
LISTEN atlantis_jobs; LISTEN atlantis_control

-- name: release_orphans
-- Fires jobs_workflow_advance (the workflow engine, live/workflows.sql) for a step's row.
-- Rows this supervisor run claimed but never received (the answer to a claim's COMMIT was
-- lost): no child runs them. Give them back at once without spending the attempt, rather
-- than let them wait for their lease to expire and be rescued as a failure. A row whose
-- cancel was requested meanwhile ends cancelled instead, saying who cancelled it. A rate
-- window forgets such a row: it did not start.
WITH released AS (
UPDATE atlantis.jobs
   SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'available' END,
       finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
       last_error = CASE WHEN cancel_requested_at IS NOT NULL
                         THEN atlantis.cancel_message(cancelled_by)
                         ELSE last_error END,
       error_count = error_count + CASE WHEN cancel_requested_at IS NOT NULL THEN 1 ELSE 0 END,
       errors = CASE WHEN cancel_requested_at IS NOT NULL
                     THEN atlantis.errors_append(errors, atlantis.cancel_entry(run, attempt - 1,
                                                                               cancelled_by)
                          || jsonb_strip_nulls(jsonb_build_object('at', now(),
                                                                  'worker', claimed_by)))
                     ELSE errors END,
       attempt = attempt - 1, run_at = now(), claimed_until = NULL
 WHERE claimed_by = %(worker)s AND state = 'running' AND NOT (id = ANY(%(known)s::bigint[]))
RETURNING id, started_at
), refund AS (
    DELETE FROM atlantis.limit_starts s USING released
     WHERE s.job_id = released.id AND s.at = released.started_at
)
SELECT id FROM released

-- name: attempt_state
-- After a result was sent on a connection that broke: did that write land?
SELECT state, run, attempt, claimed_by FROM atlantis.jobs WHERE id = %(id)s

-- name: cancel_requests
-- The polling fallback of cancellation: attempts of this supervisor whose cancel was asked.
SELECT id FROM atlantis.jobs
 WHERE claimed_by = %(worker)s AND state = 'running' AND cancel_requested_at IS NOT NULL

-- name: queue_flags
-- Served queues an operator paused, or gave a queue-wide concurrency limit (tide queue limit).
SELECT name, paused, concurrency IS NOT NULL AS limited FROM atlantis.queues
 WHERE name = ANY(%(queues)s::text[]) AND (paused OR concurrency IS NOT NULL)

-- name: limit_usage
-- Per queue: its limit, rows running, slots in use, rows held (atlantis.limit_usage).
SELECT queue, concurrency, running, limited_running, held
  FROM atlantis.limit_usage(%(queues)s::text[])

-- name: limit_hold
-- What holds a waiting job, as operators read it (NULL: nothing).
SELECT atlantis.limit_hold(%(id)s) AS held

-- name: set_queue_limit
-- A queue-wide concurrency limit (NULL removes it); returns the one it had.
SELECT atlantis.set_queue_limit(%(queue)s, %(concurrency)s, %(by)s) AS was

-- name: log_insert
-- Handler output, a batch of lines of any attempts.
INSERT INTO atlantis.logs (job_id, run, attempt, at, stream, line)
SELECT * FROM unnest(%(job_ids)s::bigint[], %(runs)s::int[], %(attempts)s::int[],
                     %(ats)s::timestamptz[], %(streams)s::text[], %(lines)s::text[])

-- name: log_trim
-- Keep only the newest `keep` lines of one attempt (its byte budget is spent); `keep` 0 keeps
-- none (a flood that passed the budget while its first lines were being written).
DELETE FROM atlantis.logs
 WHERE job_id = %(job_id)s AND run = %(run)s AND attempt = %(attempt)s
   AND id NOT IN (SELECT id FROM atlantis.logs
                   WHERE job_id = %(job_id)s AND run = %(run)s AND attempt = %(attempt)s
                   ORDER BY id DESC LIMIT %(keep)s)

-- name: queue_gauges
-- For the metrics: running jobs past their stall threshold, and the dead-letter queue.
SELECT count(*) FILTER (WHERE j.state = 'running'
                          AND coalesce(j.progress_at, j.started_at)
                              < now() - coalesce(t.stall, j.heartbeat * 3)) AS stalled,
       count(*) FILTER (WHERE j.state = 'dead') AS dead
  FROM atlantis.jobs j LEFT JOIN atlantis.job_types t ON t.job = j.job
 WHERE j.queue = ANY(%(queues)s::text[]) AND j.state IN ('running', 'dead')

-- name: sync_workflow_type
-- A workflow's declaration (WorkflowDecl.to_json); atlantis.start_workflow reads it.
INSERT INTO atlantis.workflow_types (workflow, fields, unique_fields, timeout, steps, source,
                                     synced_at)
VALUES (%(workflow)s, %(fields)s, %(unique_fields)s,
        make_interval(secs => %(timeout)s::double precision), %(steps)s, %(source)s, now())
ON CONFLICT (workflow) DO UPDATE SET
    fields = excluded.fields, unique_fields = excluded.unique_fields,
    timeout = excluded.timeout, steps = excluded.steps, source = excluded.source,
    synced_at = excluded.synced_at
