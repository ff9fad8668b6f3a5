-- Cron schedules (the supervisor's scheduler, `tide schedule list`) and retention (the
-- supervisor's pruning). The work itself is done by functions of migration 0006
-- (atlantis.schedule_fire, atlantis.prune, atlantis.prune_schedule_runs); `tide job prune`
-- calls atlantis.prune too.

-- name: schedule_now
-- The database's clock: schedules are computed against it, never against a host's.
SELECT now() AS now

-- name: schedule_fire
-- One slot of one schedule: enqueued once, however many supervisors ask.
SELECT f.outcome, f.job_id
  FROM atlantis.schedule_fire(%(job)s, %(slot)s, make_interval(secs => %(grace)s)) AS f

-- name: schedule_list
-- Every schedule in the database, with its latest run and how many slots were missed.
SELECT t.job, t.queue, t.schedule, t.tz,
       last.slot AS last_run, last.job_id AS last_job_id, j.state AS last_state,
       (SELECT count(*) FROM atlantis.schedule_runs m
         WHERE m.job = t.job AND m.job_id IS NULL) AS missed,
       now() AS db_now
  FROM atlantis.job_types t
  LEFT JOIN LATERAL (
        SELECT r.slot, r.job_id FROM atlantis.schedule_runs r
         WHERE r.job = t.job AND r.job_id IS NOT NULL
         ORDER BY r.slot DESC LIMIT 1) last ON true
  LEFT JOIN atlantis.jobs j ON j.id = last.job_id
 WHERE t.schedule IS NOT NULL
 ORDER BY t.job

-- name: retention_prune
-- One batch of retention, under an advisory lock that one supervisor at a time holds (for
-- the transaction): -1 when another holds it.
SELECT CASE WHEN pg_try_advisory_xact_lock(%(lock)s)
            THEN atlantis.prune(make_interval(secs => %(older_than)s), %(states)s::text[],
                                %(batch)s)
            ELSE -1 END AS pruned

-- name: retention_prune_schedule_runs
-- As retention_prune, for the slots recorded in atlantis.schedule_runs.
SELECT CASE WHEN pg_try_advisory_xact_lock(%(lock)s)
            THEN atlantis.prune_schedule_runs(make_interval(secs => %(older_than)s), %(batch)s)
            ELSE -1 END AS pruned
