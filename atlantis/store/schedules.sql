-- Cron schedules (the supervisor's scheduler, `tide schedule list|disable|enable`) and
-- retention (the supervisor's pruning). The work itself is done by the functions of
-- live/schedules.sql (atlantis.schedule_advance, atlantis.schedule_set_enabled, ...) and
-- live/operators.sql (atlantis.prune); `tide job prune` calls atlantis.prune too.

-- name: schedule_now
-- The database's clock: schedules are computed against it, never against a host's.
SELECT now() AS now

-- name: schedule_fire
-- One slot of one schedule: enqueued once, however many supervisors ask.
SELECT f.outcome, f.job_id
  FROM atlantis.schedule_fire(%(job)s, %(slot)s, make_interval(secs => %(grace)s)) AS f

-- name: schedule_latest
-- Where each of the jobs stands (atlantis.schedule_cursor: the latest slot enqueued, missed or
-- skipped, or the moment it was enabled again): where a scheduler that starts goes on from.
SELECT c.job, c.slot
  FROM (SELECT j.job, atlantis.schedule_cursor(j.job) AS slot
          FROM unnest(%(jobs)s::text[]) AS j(job)) AS c
 WHERE c.slot IS NOT NULL

-- name: schedule_advance
-- The slots of one schedule after `after` (its cursor): one row for the missed ones, a job
-- for each due one unless `overlap` skips it; 'stale' (and the cursor) if `after` is no longer
-- it, 'disabled' while an operator switched it off, 'busy' while another supervisor fires it.
SELECT a.outcome, a.last_slot, a.job_ids, a.job_slots, a.skipped, a.open_job
  FROM atlantis.schedule_advance(%(job)s, %(after)s, %(missed_from)s, %(missed_to)s,
                                 %(missed)s, %(due)s::timestamptz[], %(overlap)s) AS a

-- name: schedule_set_enabled
-- The operator's switch: whether it changed (ATL31 for a job without a schedule).
SELECT atlantis.schedule_set_enabled(%(job)s, %(enabled)s,
                                     coalesce(%(by)s::text, current_user::text)) AS changed

-- name: schedule_list
-- Every schedule in the database, with its latest run and the slots missed that retention
-- keeps: how many (a row of atlantis.schedule_runs without a job stands for `missed` slots,
-- from `missed_from` to `slot`), in how many runs, and the latest run of them; its overlap,
-- its operator's switch, and the slots it skipped (atlantis.schedules, migration 0033).
SELECT t.job, t.queue, t.schedule, t.tz, coalesce(t.overlap, 'skip') AS overlap,
       coalesce(sc.enabled, true) AS enabled, sc.changed_by AS switched_by,
       sc.changed_at AS switched_at, coalesce(sc.skipped, 0) AS skipped,
       sc.last_skipped,
       last.slot AS last_run, last.job_id AS last_job_id, j.state AS last_state,
       coalesce(m.missed, 0) AS missed, coalesce(m.ranges, 0) AS missed_ranges,
       lm.missed_from AS last_missed_from, lm.slot AS last_missed,
       coalesce(lm.missed, 0) AS last_missed_count,
       now() AS db_now
  FROM atlantis.job_types t
  LEFT JOIN atlantis.schedules sc ON sc.job = t.job
  LEFT JOIN LATERAL (
        SELECT sum(greatest(r.missed, 1))::bigint AS missed, count(*) AS ranges
          FROM atlantis.schedule_runs r
         WHERE r.job = t.job AND r.job_id IS NULL) m ON true
  LEFT JOIN LATERAL (
        SELECT r.slot, coalesce(r.missed_from, r.slot) AS missed_from,
               greatest(r.missed, 1) AS missed
          FROM atlantis.schedule_runs r
         WHERE r.job = t.job AND r.job_id IS NULL
         ORDER BY r.slot DESC LIMIT 1) lm ON true
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
