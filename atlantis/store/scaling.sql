-- The scaling signal (issue 37): what `tide queue signal`, `tide metrics serve` and the
-- console's /metrics read, with no supervisor running (atlantis/store/scaling.py).

-- name: queue_signal
-- Per queue (NULL: every queue anything names): claimable, the oldest claimable's age,
-- running, delayed, held by a limit, suspended, paused (live/signal.sql).
SELECT queue, claimable, oldest_claimable_seconds, running, delayed, limit_held, suspended,
       paused, exact
  FROM atlantis.queue_signal(%(queue)s)

-- name: workers_silent
-- Supervisors that are silent: not seen for two of their own liveness intervals (a row of a
-- release one behind: once it expired), among those `tide worker list` shows (live, or
-- expired while they still hold running rows). liveness.sql spells the rule the same way.
-- And the operators' orders in force, by action (orders.sql): supervisor names drained or
-- evicted until `tide worker resume`, whether a supervisor of the name runs now or not.
SELECT (SELECT count(*)
          FROM atlantis.workers w
         WHERE (w.expires_at > now()
                OR EXISTS (SELECT 1 FROM atlantis.jobs j
                            WHERE j.state = 'running' AND j.claimed_by = w.id))
           AND CASE WHEN w.liveness_interval IS NULL THEN w.expires_at < now()
                    ELSE now() - w.seen_at > make_interval(secs => 2 * w.liveness_interval)
               END) AS silent,
       (SELECT count(*) FROM atlantis.worker_orders o WHERE o.action = 'drain') AS drained,
       (SELECT count(*) FROM atlantis.worker_orders o WHERE o.action = 'evict') AS evicted
