-- ---- Liveness (issue 36, migration 0029) ------------------------------------------------
-- A supervisor that starts (or runs) on the same host as one that is provably gone (its
-- lock file in the runtime directory could be locked, and no process carrying its mark is
-- left: atlantis/supervisor/identity.py) releases that one's running rows at once, instead
-- of waiting for their leases to end. The attempt counts as failed, as a rescue of an
-- expired lease: both go through atlantis.rescue_rows, the one home of the rescue's rule.
-- Fenced on the row still `running` under that worker's claim: a claim id is never reused,
-- so a row claimed again since (by anyone) is not touched.
-- The rescue's rule, once (the `rescue` statement of queries.sql and atlantis.rescue_gone):
-- rows `ids`, locked by the caller FOR UPDATE and still `running`, whose worker is gone
-- (`gone`: provably, on its host) or presumed dead (their lease expired). The attempt counts
-- as failed (kind `lease_expired`) and the row goes back at once, or to dead when it was
-- the last attempt, or to cancelled when a cancel was asked. Unless the previous attempt of
-- its run also ended so (the last error is that attempt's `lease_expired`): an attempt that
-- takes its supervisor down would otherwise be retried in a tight loop across the fleet, so
-- from the second time in a row on the row waits the job's backoff (atlantis.retry_delay,
-- at most `max_backoff` seconds). Each attempt is recorded in atlantis.attempts, and one
-- NOTIFY on atlantis_finished names the rows that ended (atlantis.wait).
CREATE OR REPLACE FUNCTION atlantis.rescue_rows(ids bigint[], rescuer text, max_backoff float8,
                                                gone boolean)
RETURNS TABLE (id bigint, state text, queue text)
LANGUAGE sql VOLATILE
AS $$
WITH done AS (
    UPDATE atlantis.jobs j
       SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                        WHEN atlantis.out_of_attempts(j.attempt, j.max_attempts) THEN 'dead'
                        ELSE 'available' END,
           run_at = now() + CASE
               WHEN j.cancel_requested_at IS NULL
                    AND NOT atlantis.out_of_attempts(j.attempt, j.max_attempts)
                    AND j.errors->-1 @> jsonb_build_object('kind', 'lease_expired', 'run', j.run,
                                                           'attempt', j.attempt - 1)
               THEN atlantis.retry_delay(j.backoff, j.attempt,
                                         make_interval(secs => rescue_rows.max_backoff))
               ELSE interval '0' END,
           claimed_until = NULL,
           finished_at = CASE WHEN atlantis.out_of_attempts(j.attempt, j.max_attempts)
                                   OR j.cancel_requested_at IS NOT NULL THEN now() END,
           last_error = CASE WHEN j.cancel_requested_at IS NOT NULL
                             THEN atlantis.cancel_message(j.cancelled_by)
                             ELSE atlantis.rescue_message(j.claimed_by, rescue_rows.gone) END,
           error_count = j.error_count + 1,
           errors = atlantis.errors_append(j.errors, CASE
               WHEN j.cancel_requested_at IS NOT NULL
               THEN atlantis.cancel_entry(j.run, j.attempt, j.cancelled_by) || jsonb_build_object(
                    'message', atlantis.cancel_message(j.cancelled_by) || ' ('
                               || atlantis.rescue_message(j.claimed_by, rescue_rows.gone) || ')')
               ELSE jsonb_build_object(
                    'run', j.run, 'attempt', j.attempt, 'kind', 'lease_expired',
                    'message', atlantis.rescue_message(j.claimed_by, rescue_rows.gone))
               END || jsonb_build_object('at', now(), 'worker', j.claimed_by,
                                         'rescued_by', rescue_rows.rescuer))
     WHERE j.id = ANY (rescue_rows.ids) AND j.state = 'running'
    RETURNING j.id, j.state, j.queue, j.run, j.attempt, j.started_at,
              j.errors->-1->>'worker' AS worker
), timeline AS (
    INSERT INTO atlantis.attempts (job_id, run, attempt, worker, started_at, outcome, error_kind)
    SELECT d.id, d.run, d.attempt, d.worker, d.started_at, 'lease_expired',
           CASE WHEN d.state = 'cancelled' THEN 'cancelled' ELSE 'lease_expired' END
      FROM done d
), ended AS MATERIALIZED (
    SELECT count(*) AS sent FROM (
        SELECT pg_notify('atlantis_finished',
                         CASE WHEN octet_length(e.ids) < 8000 THEN e.ids ELSE '' END)
          FROM (SELECT string_agg(d.id::text, ',') AS ids FROM done d
                 WHERE d.state IN ('dead', 'cancelled')) e
         WHERE e.ids IS NOT NULL) g
)
SELECT d.id, d.state, d.queue FROM done d CROSS JOIN ended
$$;
REVOKE ALL ON FUNCTION atlantis.rescue_rows(bigint[], text, float8, boolean) FROM PUBLIC;

-- What a rescued row's error says of its worker.
CREATE OR REPLACE FUNCTION atlantis.rescue_message(worker text, gone boolean) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN rescue_message.gone
                THEN format('worker %s gone: no process of it is left on its host',
                            rescue_message.worker)
                ELSE format('lease expired, worker %s presumed dead', rescue_message.worker) END
$$;
REVOKE ALL ON FUNCTION atlantis.rescue_message(text, boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION atlantis.rescue_gone(worker text, rescuer text, max_backoff float8)
RETURNS TABLE (id bigint, state text, queue text)
LANGUAGE sql VOLATILE
AS $$
    SELECT r.id, r.state, r.queue
      FROM atlantis.rescue_rows(ARRAY(SELECT g.id FROM atlantis.jobs g
                                       WHERE g.state = 'running'
                                         AND g.claimed_by = rescue_gone.worker
                                       ORDER BY g.id
                                         FOR UPDATE SKIP LOCKED),
                                rescue_gone.rescuer, rescue_gone.max_backoff, true) r
$$;
REVOKE ALL ON FUNCTION atlantis.rescue_gone(text, text, float8) FROM PUBLIC;
