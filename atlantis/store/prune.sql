-- Named statements of `tide db sync --prune` (atlantis/store/prune.py): the declarations an
-- app no longer declares, what keeps each of them, and their removal. An app's own
-- declarations are those in the namespaces its declarations use (the part of a name before
-- its dot): atlantis.job_types and atlantis.workflow_types record no app.

-- name: prune_workflows
-- The workflow declarations of `namespaces` not in `declared`, with their instances not
-- ended (running, compensating, or compensation_failed and not dismissed: an operator may
-- still retry it).
SELECT w.workflow,
       (SELECT count(*) FROM atlantis.workflow_instances i
         WHERE i.workflow = w.workflow
           AND (i.state IN ('running', 'compensating')
                OR (i.state = 'compensation_failed' AND i.dismissed_at IS NULL))) AS active
  FROM atlantis.workflow_types w
 WHERE split_part(w.workflow, '.', 1) = ANY(%(namespaces)s::text[])
   AND NOT w.workflow = ANY(%(declared)s::text[])
 ORDER BY w.workflow

-- name: prune_jobs
-- The job declarations of `namespaces` not in `declared`, with what keeps each: its waiting
-- and running rows, its schedule, the workflow declarations (any app's, those in `leaving`
-- left out) whose steps or compensations use it, and the live supervisors (host:pid) whose
-- served jobs list it: an older release of a rolling deploy still serving it (one of a
-- release before migration 0014 records no jobs, and is taken to serve every job of its
-- queues).
SELECT t.job, t.schedule,
       (SELECT count(*) FROM atlantis.jobs j
         WHERE j.state IN ('available', 'running') AND j.job = t.job) AS active,
       ARRAY(SELECT w.workflow FROM atlantis.workflow_types w
              WHERE NOT w.workflow = ANY(%(leaving)s::text[])
                AND EXISTS (SELECT 1 FROM jsonb_array_elements(w.steps) s
                             WHERE s->>'job' = t.job OR s->>'compensate' = t.job)
              ORDER BY w.workflow) AS workflows,
       ARRAY(SELECT s.host || ':' || s.pid FROM atlantis.workers s
              WHERE s.expires_at > now()
                AND (t.job = ANY(s.job_types)
                     OR (s.job_types IS NULL AND t.queue = ANY(s.queues)))
              ORDER BY s.host, s.pid) AS supervisors
  FROM atlantis.job_types t
 WHERE split_part(t.job, '.', 1) = ANY(%(namespaces)s::text[])
   AND NOT t.job = ANY(%(declared)s::text[])
 ORDER BY t.job

-- name: prune_lock_workflows
-- Lock the workflow declarations about to go, in name order (two prunes never deadlock); a
-- sync of one of them (a supervisor starting) waits, and inserts it anew after the commit.
SELECT w.workflow FROM atlantis.workflow_types w
 WHERE w.workflow = ANY(%(names)s::text[])
 ORDER BY w.workflow
   FOR UPDATE

-- name: prune_lock_jobs
-- As prune_lock_workflows, for job declarations.
SELECT t.job FROM atlantis.job_types t
 WHERE t.job = ANY(%(names)s::text[])
 ORDER BY t.job
   FOR UPDATE

-- name: prune_delete_workflows
DELETE FROM atlantis.workflow_types w
 WHERE w.workflow = ANY(%(names)s::text[])
RETURNING w.workflow

-- name: prune_delete_jobs
-- The declarations, and the schedule records of those that once had a schedule (a schedule
-- declared again later starts afresh rather than catching up from an old slot).
WITH runs AS (
    DELETE FROM atlantis.schedule_runs r WHERE r.job = ANY(%(names)s::text[])
)
DELETE FROM atlantis.job_types t
 WHERE t.job = ANY(%(names)s::text[])
RETURNING t.job
