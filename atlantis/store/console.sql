-- The statements only the web console (`tide console`, atlantis/console) needs, by name.
-- Loaded with queries.sql and admin.sql by atlantis/store/queries.py; the same rules hold:
-- every value a parameter. Run only through atlantis/store/console_queries.py. Reads of
-- single jobs, queues, workers, logs and schedules, and every change of a job's or queue's
-- state, are admin.sql's and the SQL functions' (atlantis.cancel, retry, pause, resume):
-- not here.

-- name: console_jobs_page
-- One page of jobs, newest first, by keyset (`before`: the smallest id of the previous
-- page), filtered by state, queue, job name and args containment (`args @> ...`), at ids
-- of at least `floor` when given (a filter no index serves searches a window of ids per
-- page). The columns are job_get's, so rows read into admin.JobRow.
SELECT * FROM atlantis.job_rows
 WHERE (%(before)s::bigint IS NULL OR id < %(before)s)
   AND (%(floor)s::bigint IS NULL OR id >= %(floor)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(job)s::text IS NULL OR job = %(job)s)
   AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: console_max_id
-- The newest job's id (0 when there is none), through the primary key.
SELECT coalesce(max(id), 0) AS id FROM atlantis.jobs

-- name: console_job_ids
-- The ids a bulk action "by filter" acts on (the same filters as console_jobs_page, and
-- only jobs in `states`), newest first, at most `limit`.
SELECT id
  FROM atlantis.jobs j
 WHERE state = ANY(%(states)s::text[])
   AND (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(job)s::text IS NULL OR job = %(job)s)
   AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: console_ids_in_states
-- Of the ids given, those in `states` (what a bulk action by selection would touch).
SELECT id FROM atlantis.jobs
 WHERE id = ANY(%(ids)s::bigint[]) AND state = ANY(%(states)s::text[])
 ORDER BY id DESC

-- name: console_delete_finished
-- Delete finished jobs by id, with their attempts and logs; returns how many jobs went.
-- Waiting and running jobs are never deleted. Through the function an operator may call.
SELECT atlantis.delete_finished(%(ids)s::bigint[]) AS deleted

-- name: console_dlq_groups
-- The dead-letter queue grouped by error fingerprint: the last error's kind and first line.
-- `newest_id` is a job to open; `newest_at` when the newest of the group died.
SELECT j.queue, j.job,
       coalesce(j.errors->-1->>'kind', 'unknown') AS kind,
       left(split_part(coalesce(j.last_error, j.errors->-1->>'message', ''), E'\n', 1), 300)
           AS first_line,
       count(*)::int AS count, max(j.id) AS newest_id, max(j.finished_at) AS newest_at
  FROM atlantis.jobs j
 WHERE j.state = 'dead' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
 GROUP BY 1, 2, 3, 4
 ORDER BY count(*) DESC, max(j.id) DESC
 LIMIT %(limit)s

-- name: console_throughput
-- Jobs completed per minute over the last hour, per queue (the overview's sparklines);
-- minutes with none are absent. Reads only recent rows through jobs_finished_idx.
SELECT queue,
       (extract(epoch FROM date_trunc('minute', now()) - date_trunc('minute', finished_at))
        / 60)::int AS minutes_ago,
       count(*)::int AS count
  FROM atlantis.jobs
 WHERE finished_at > now() - interval '1 hour' AND state = 'complete'
 GROUP BY queue, date_trunc('minute', finished_at)

-- name: console_estimated_jobs
-- The planner's estimate of how many rows atlantis.jobs holds (never a count(*)): -1 before
-- the table was first analyzed.
SELECT coalesce((SELECT c.reltuples::bigint FROM pg_class c
                  WHERE c.oid = 'atlantis.jobs'::regclass), -1) AS estimate

-- name: console_logs_since
-- The log lines written after line id `after` by any of the jobs in `ids` (the jobs whose
-- pages are open), in order, at most `limit`: one statement for every open page.
SELECT id, job_id, run, attempt, at, stream, line
  FROM atlantis.logs
 WHERE job_id = ANY(%(ids)s::bigint[]) AND id > %(after)s
 ORDER BY id
 LIMIT %(limit)s

-- name: console_log_tail
-- The newest `limit` lines of one attempt, (run, attempt) (oldest first once reversed by
-- the caller).
SELECT id, job_id, run, attempt, at, stream, line
  FROM atlantis.logs
 WHERE job_id = %(job_id)s AND run = %(run)s AND attempt = %(attempt)s
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: console_log_last_id
-- The newest log line id anywhere (where a fresh follower of every job starts).
SELECT coalesce(max(id), 0) AS id FROM atlantis.logs

-- name: console_audit_insert
INSERT INTO atlantis.console_audit (action, target, detail, client, label, outcome)
VALUES (%(action)s, %(target)s, %(detail)s, %(client)s, %(label)s, %(outcome)s)
RETURNING id

-- name: console_audit_list
SELECT id, at, action, target, detail, client, label, outcome
  FROM atlantis.console_audit
 WHERE (%(before)s::bigint IS NULL OR id < %(before)s)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: console_listen
-- What the console's live pages follow, on one autocommit connection: atlantis_jobs (a
-- queue has new work), atlantis_control (cancel, pause, resume: a JSON object naming the
-- job_id or queue) and atlantis_progress (a JSON array of the ids of jobs whose row changed).
LISTEN atlantis_jobs; LISTEN atlantis_control; LISTEN atlantis_progress
