-- `tide db doctor` (atlantis.store.doctor): read-only health checks. Nothing here writes.
-- The thresholds arrive as parameters; what counts as a problem is decided in doctor.py.

-- name: doctor_other_sessions
-- Client sessions on this server other than this one (`tide db upgrade-home` needs none).
SELECT count(*)::int AS sessions
  FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()

-- name: doctor_server_version
-- The server's version; atlantis needs 16 or newer (pg_input_is_valid). Needs no schema.
SELECT current_setting('server_version_num')::int AS version_num,
       current_setting('server_version') AS version

-- name: doctor_live_supervisors
SELECT count(*) AS live FROM atlantis.workers WHERE expires_at > now()

-- name: doctor_jobs_table
-- atlantis.jobs as the statistics collector and the catalog see it, for a bloat estimate
-- (pgstattuple is not assumed): live and dead tuples, pages, the fillfactor, and the average
-- width of a row's columns (NULL until the table was analyzed).
SELECT coalesce(s.n_live_tup, 0) AS live_tuples, coalesce(s.n_dead_tup, 0) AS dead_tuples,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       pg_relation_size(c.oid) AS table_bytes,
       current_setting('block_size')::int AS block_size,
       coalesce((SELECT split_part(o, '=', 2)::int FROM unnest(c.reloptions) o
                  WHERE starts_with(o, 'fillfactor=')), 100) AS fillfactor,
       (SELECT CASE WHEN count(st.avg_width) > 0 THEN sum(st.avg_width)::float8 END
          FROM pg_stats st
         WHERE st.schemaname = 'atlantis' AND st.tablename = 'jobs') AS row_width
  FROM pg_class c
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.oid = 'atlantis.jobs'::regclass

-- name: doctor_jobs_indexes
-- Each btree index of atlantis.jobs: its size, its tuples as of the last vacuum or analyze
-- (-1: never counted) and the average width of its key (NULL unless every key column has
-- statistics).
SELECT i.relname::text AS name, pg_relation_size(i.oid) AS index_bytes,
       i.reltuples::float8 AS tuples, x.indpred IS NOT NULL AS partial,
       (SELECT CASE WHEN count(st.avg_width) = cardinality(x.indkey::int2[])
                    THEN sum(st.avg_width)::float8 END
          FROM pg_attribute a
          LEFT JOIN pg_stats st ON st.schemaname = 'atlantis' AND st.tablename = 'jobs'
                               AND st.attname = a.attname
         WHERE a.attrelid = x.indrelid AND a.attnum = ANY(x.indkey::int2[])) AS key_width
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_am am ON am.oid = i.relam
 WHERE x.indrelid = 'atlantis.jobs'::regclass AND am.amname = 'btree'
 ORDER BY i.relname

-- name: doctor_old_transactions
-- What holds back vacuum in this database: sessions whose transaction (with a snapshot or a
-- transaction id) began more than `age` seconds ago, prepared transactions as old, and
-- inactive replication slots that keep an xmin. Needs pg_read_all_stats (pg_monitor) to see
-- other roles' sessions. Query texts are not read: they may hold secrets.
SELECT 'session' AS kind, a.pid, a.usename::text AS role, a.application_name AS name,
       a.state, a.xact_start AS since,
       extract(epoch FROM now() - a.xact_start)::float8 AS age_seconds,
       age(coalesce(a.backend_xmin, a.backend_xid))::bigint AS xid_age
  FROM pg_stat_activity a
 WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
   AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
   AND a.xact_start < now() - make_interval(secs => %(age)s)
UNION ALL
SELECT 'prepared', NULL, p.owner::text, p.gid, 'prepared', p.prepared,
       extract(epoch FROM now() - p.prepared)::float8, age(p.transaction)::bigint
  FROM pg_prepared_xacts p
 WHERE p.database = current_database()
   AND p.prepared < now() - make_interval(secs => %(age)s)
UNION ALL
SELECT 'replication slot', NULL, NULL, s.slot_name::text, 'inactive', NULL, NULL,
       greatest(age(s.xmin), age(s.catalog_xmin))::bigint
  FROM pg_replication_slots s
 WHERE NOT s.active AND (s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL)
   AND (s.database IS NULL OR s.database = current_database())
 ORDER BY since NULLS LAST, xid_age DESC

-- name: doctor_expired_leases
-- Rows still `running` whose lease ended more than `grace` seconds ago: a live supervisor's
-- rescue releases them within seconds, so these mean no supervisor is rescuing.
SELECT j.id, j.job, j.queue, j.attempt, j.claimed_by, j.claimed_until,
       extract(epoch FROM now() - j.claimed_until)::float8 AS overdue_seconds,
       count(*) OVER () AS total
  FROM atlantis.jobs j
 WHERE j.state = 'running' AND j.claimed_until < now() - make_interval(secs => %(grace)s)
 ORDER BY j.claimed_until, j.id
 LIMIT %(limit)s

-- name: doctor_unserved_queues
-- Queues with due jobs waiting and no live supervisor serving them (paused or not).
WITH live AS (
    SELECT queues FROM atlantis.workers WHERE expires_at > now()
)
SELECT j.queue, count(*) AS waiting, min(j.run_at) AS oldest,
       extract(epoch FROM now() - min(j.run_at))::float8 AS oldest_seconds,
       coalesce((SELECT q.paused FROM atlantis.queues q WHERE q.name = j.queue), false) AS paused
  FROM atlantis.jobs j
 WHERE j.state = 'available' AND j.run_at <= now()
   AND NOT EXISTS (SELECT 1 FROM live WHERE j.queue = ANY(live.queues))
 GROUP BY j.queue
 ORDER BY j.queue

-- name: doctor_unserved_jobs
-- Due jobs on a queue that live supervisors serve, of a type none of them handles (their
-- `job_types`; NULL, a supervisor of an earlier release: every job): a job added to the app
-- that no supervisor was restarted or reloaded for. Queues nobody serves at all are
-- doctor_unserved_queues' rows.
WITH live AS (
    SELECT queues, job_types FROM atlantis.workers WHERE expires_at > now()
)
SELECT j.queue, j.job, count(*) AS waiting, min(j.run_at) AS oldest,
       extract(epoch FROM now() - min(j.run_at))::float8 AS oldest_seconds
  FROM atlantis.jobs j
 WHERE j.state = 'available' AND j.run_at <= now()
   AND EXISTS (SELECT 1 FROM live WHERE j.queue = ANY(live.queues))
   AND NOT EXISTS (SELECT 1 FROM live
                    WHERE j.queue = ANY(live.queues)
                      AND (live.job_types IS NULL OR j.job = ANY(live.job_types)))
 GROUP BY j.queue, j.job
 ORDER BY j.queue, j.job

-- name: doctor_unserved_declarations
-- Declarations whose queue no live supervisor serves: their jobs would wait.
WITH live AS (
    SELECT queues FROM atlantis.workers WHERE expires_at > now()
)
SELECT t.job, t.queue, t.schedule
  FROM atlantis.job_types t
 WHERE NOT EXISTS (SELECT 1 FROM live WHERE t.queue = ANY(live.queues))
 ORDER BY t.job

-- name: doctor_missed_slots
-- Per schedule, the slots recorded as missed (atlantis.schedule_runs rows without a job, each
-- standing for `missed` slots from `missed_from` to `slot`) that retention still keeps, and
-- how many of them are in runs that ended within the last `within` seconds.
SELECT r.job, sum(greatest(r.missed, 1))::bigint AS missed,
       coalesce(sum(greatest(r.missed, 1))
                FILTER (WHERE r.slot > now() - make_interval(secs => %(within)s)), 0)::bigint
           AS recent,
       max(r.slot) AS last_missed, min(coalesce(r.missed_from, r.slot)) AS first_missed,
       count(*) AS ranges
  FROM atlantis.schedule_runs r
 WHERE r.job_id IS NULL
 GROUP BY r.job
 ORDER BY r.job

-- name: doctor_duplicate_unique_keys
-- Waiting or running jobs of one name that hold one unique key as atlantis.unique_key builds
-- it today (migration 0012): duplicates enqueued before it, when keys were JSON spellings
-- (1 and 1.0, a uuid in upper case), which its re-keying left as they were.
SELECT j.job, atlantis.unique_key(t, j.args) AS key, count(*) AS jobs,
       array_agg(j.id ORDER BY j.id) AS ids
  FROM atlantis.jobs j
  JOIN atlantis.job_types t ON t.job = j.job
 WHERE j.state IN ('available', 'running') AND j.unique_key IS NOT NULL
   AND cardinality(t.unique_fields) > 0
 GROUP BY j.job, 2
HAVING count(*) > 1
 ORDER BY j.job, 2
 LIMIT %(limit)s
