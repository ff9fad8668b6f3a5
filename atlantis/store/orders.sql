-- Operators' orders to one supervisor: drain, evict, resume (issue 37, migration 0032;
-- the functions are live/workers.sql's, the supervisor's side atlantis/supervisor/orders.py).

-- name: worker_order
SELECT id, name, silent, in_flight
  FROM atlantis.order_worker(%(worker)s, %(action)s, %(exit)s, coalesce(%(by)s::text, current_user::text))

-- name: worker_resume
SELECT atlantis.resume_worker(%(worker)s, coalesce(%(by)s::text, current_user::text)) AS name

-- name: worker_orders
-- Every standing order, for `tide worker list` and the console: by name.
SELECT o.name, o.worker_id, o.action, o.exit_when_drained, o.asked_by, o.asked_at, o.drained_at
  FROM atlantis.worker_orders o
 ORDER BY o.name

-- name: worker_order_adopt
-- At start: the order kept for this supervisor's name (a drained supervisor that restarted),
-- now this run's. The exit asked of an earlier run is not this run's: it stays up, drained.
UPDATE atlantis.worker_orders o
   SET worker_id = %(id)s,
       exit_when_drained = o.exit_when_drained AND o.worker_id = %(id)s
 WHERE o.name = %(name)s
RETURNING o.action, o.exit_when_drained

-- name: worker_order_read
-- This run's order now (none: it claims). An order given to an earlier run of the same name
-- while this one started is this one's too.
SELECT o.action, o.exit_when_drained AND o.worker_id = %(id)s AS exit_when_drained
  FROM atlantis.worker_orders o
 WHERE o.name = %(name)s

-- name: worker_order_drained
-- The supervisor has nothing in flight any more under its order (once per order).
UPDATE atlantis.worker_orders o
   SET drained_at = now()
 WHERE o.name = %(name)s AND o.action = %(action)s AND o.drained_at IS NULL
