-- Events (issue 35): sending one (in the caller's transaction), a handler's wait for one (on
-- its run's step connection, fenced), and the rescue's sweep. Loaded by
-- atlantis/store/queries.py; the functions are in live/events.sql.

-- name: event_send
SELECT atlantis.send_event(%(job_id)s, %(event)s, %(payload)s::jsonb,
                           coalesce(%(by)s::text, current_user::text))

-- name: step_wait_event
SELECT delivered, payload, wake
  FROM atlantis.step_wait_event(%(job_id)s, %(run_id)s, %(name)s, %(event)s,
                                %(seconds)s::float8, %(attempt)s)

-- name: event_sweep
SELECT atlantis.event_sweep(%(limit)s)
