-- ---- Liveness (issue 36, migration 0029) ------------------------------------------------
-- A supervisor that starts (or runs) on the same host as one that is provably gone (its
-- lock file in the runtime directory could be locked, and no process carrying its mark is
-- left: atlantis/supervisor/identity.py) releases that one's running rows at once, instead
-- of waiting for their leases to end. The attempt counts as failed, as a rescue of an
-- expired lease (the `rescue` statement of queries.sql): kind `lease_expired`, so that an
-- attempt that takes its supervisor down is retried after its backoff from the second time
-- on, here as there. Fenced on the row still `running` under that worker's claim: a claim
-- id is never reused, so a row claimed again since (by anyone) is not touched.
CREATE OR REPLACE FUNCTION atlantis.rescue_gone(worker text, rescuer text, max_backoff float8)
RETURNS TABLE (id bigint, state text, queue text)
LANGUAGE sql VOLATILE
AS $$
WITH gone AS MATERIALIZED (
    SELECT g.id FROM atlantis.jobs g
     WHERE g.state = 'running' AND g.claimed_by = rescue_gone.worker
     ORDER BY g.id
       FOR UPDATE SKIP LOCKED
), done AS (
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
                                         make_interval(secs => rescue_gone.max_backoff))
               ELSE interval '0' END,
           claimed_until = NULL,
           finished_at = CASE WHEN atlantis.out_of_attempts(j.attempt, j.max_attempts)
                                   OR j.cancel_requested_at IS NOT NULL THEN now() END,
           last_error = CASE WHEN j.cancel_requested_at IS NOT NULL
                             THEN atlantis.cancel_message(j.cancelled_by)
                             ELSE format('worker %s gone: no process of it is left on its host',
                                         j.claimed_by) END,
           error_count = j.error_count + 1,
           errors = atlantis.errors_append(j.errors, CASE
               WHEN j.cancel_requested_at IS NOT NULL
               THEN atlantis.cancel_entry(j.run, j.attempt, j.cancelled_by) || jsonb_build_object(
                    'message', atlantis.cancel_message(j.cancelled_by)
                               || format(' (worker %s gone)', j.claimed_by))
               ELSE jsonb_build_object(
                    'run', j.run, 'attempt', j.attempt, 'kind', 'lease_expired',
                    'message', format('worker %s gone: no process of it is left on its host',
                                      j.claimed_by))
               END || jsonb_build_object('at', now(), 'worker', j.claimed_by,
                                         'rescued_by', rescue_gone.rescuer))
      FROM gone
     WHERE j.id = gone.id AND j.state = 'running' AND j.claimed_by = rescue_gone.worker
    RETURNING j.id, j.state, j.queue, j.run, j.attempt, j.started_at,
              j.errors->-1->>'worker' AS worker
), timeline AS (
    INSERT INTO atlantis.attempts (job_id, run, attempt, worker, started_at, outcome, error_kind)
    SELECT d.id, d.run, d.attempt, d.worker, d.started_at, 'lease_expired',
           CASE WHEN d.state = 'cancelled' THEN 'cancelled' ELSE 'lease_expired' END
      FROM done d
)
SELECT d.id, d.state, d.queue FROM done d
$$;
REVOKE ALL ON FUNCTION atlantis.rescue_gone(text, text, float8) FROM PUBLIC;
