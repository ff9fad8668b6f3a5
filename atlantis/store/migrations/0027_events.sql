-- Events (issue 35): what atlantis.send_event sends to a job, kept until a handler's
-- ctx.wait_for_event consumes it (each one once, in the transaction of the wait's record).
-- The bodies of the functions live in atlantis/store/live/events.sql.
CREATE TABLE atlantis.job_events (
    id          bigserial PRIMARY KEY,
    job_id      bigint NOT NULL REFERENCES atlantis.jobs (id) ON DELETE CASCADE,
    event       text NOT NULL CHECK (char_length(event) BETWEEN 1 AND 200),
    payload     jsonb,
    sent_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_by     text,
    consumed_at timestamptz,
    consumed_by text   -- the wait's step name
);
-- The events a job has not consumed, oldest first: what a wait and the sweep look for.
CREATE INDEX job_events_pending_idx ON atlantis.job_events (job_id, event, id)
    WHERE consumed_at IS NULL;

CREATE FUNCTION atlantis.send_event(job_id bigint, event text, payload jsonb DEFAULT NULL,
                                    by text DEFAULT current_user)
RETURNS bigint LANGUAGE sql AS $$ SELECT NULL::bigint $$;
CREATE FUNCTION atlantis.step_wait_event(job_id bigint, run_id uuid, name text, event text,
                                         seconds float8, attempt int)
RETURNS TABLE (delivered boolean, payload text, wake timestamptz)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;
CREATE FUNCTION atlantis.event_sweep(n int) RETURNS bigint
LANGUAGE sql AS $$ SELECT 0::bigint $$;

-- A wait for an event is a handler step of its own kind: its record holds the deadline while
-- it waits, then the payload it received (or that it timed out).
ALTER TABLE atlantis.job_steps DROP CONSTRAINT job_steps_kind_check;
ALTER TABLE atlantis.job_steps ADD CONSTRAINT job_steps_kind_check
    CHECK (kind IN ('step', 'transaction', 'sleep', 'event'));
