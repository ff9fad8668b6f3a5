-- ---- Events (issue 35, migration 0027) --------------------------------------------------
-- atlantis.send_event keeps an event for its job; a handler's ctx.wait_for_event consumes
-- the oldest of that name, once, in the transaction that records the wait's step.
-- SQLSTATE ATL04: no such job; ATL22: the job has ended; ATL23: a bad event (its name, its
-- payload's size, too many pending).

-- Send `event` to job `job_id`; returns the event's id. A job that waits for it (available,
-- suspended_for 'event:<event>') is woken at once.
CREATE OR REPLACE FUNCTION atlantis.send_event(job_id bigint, event text, payload jsonb DEFAULT NULL,
                                               by text DEFAULT current_user)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    j record;
    sent bigint;
BEGIN
    IF send_event.event IS NULL OR char_length(send_event.event) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'an event''s name must be 1 to 200 characters' USING ERRCODE = 'ATL23';
    END IF;
    IF octet_length(send_event.payload::text) > 65536 THEN
        RAISE EXCEPTION 'event % to job %: its payload is % bytes of JSON, more than the limit of 65536',
            send_event.event, send_event.job_id, octet_length(send_event.payload::text)
            USING ERRCODE = 'ATL23';
    END IF;
    SELECT x.state, x.suspended_for, x.queue INTO j FROM atlantis.jobs x
     WHERE x.id = send_event.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', send_event.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.state IN ('complete', 'dead', 'cancelled') THEN
        RAISE EXCEPTION 'job % is %: an event can no longer reach it', send_event.job_id, j.state
            USING ERRCODE = 'ATL22';
    END IF;
    IF (SELECT count(*) FROM atlantis.job_events e
         WHERE e.job_id = send_event.job_id AND e.consumed_at IS NULL) >= 1000 THEN
        RAISE EXCEPTION 'job % already has 1000 events it has not consumed, the most it may hold',
            send_event.job_id USING ERRCODE = 'ATL23';
    END IF;
    INSERT INTO atlantis.job_events (job_id, event, payload, sent_by)
    VALUES (send_event.job_id, send_event.event, send_event.payload, send_event.by)
    RETURNING id INTO sent;
    IF j.state = 'available' AND j.suspended_for = 'event:' || send_event.event THEN
        UPDATE atlantis.jobs x SET run_at = now() WHERE x.id = send_event.job_id AND x.run_at > now();
        PERFORM pg_notify('atlantis_jobs', j.queue);
    END IF;
    RETURN sent;
END
$$;

-- A handler's wait for `event` under the step `name`, for the run that holds the job:
-- 'delivered' (the oldest pending event of that name consumed, its payload recorded as the
-- step's value, in this transaction), 'timeout' (the deadline, fixed when the wait was first
-- reached, has passed: recorded too, so that no later event is delivered to it) or
-- 'waiting' (wake: the deadline, or 9999-12-31 without one).
CREATE OR REPLACE FUNCTION atlantis.step_wait_event(job_id bigint, run_id uuid, name text,
                                                    event text, seconds float8, attempt int)
RETURNS TABLE (delivered boolean, payload text, wake timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    rec jsonb;
    ev record;
    deadline timestamptz;
    val jsonb;
BEGIN
    PERFORM atlantis.step_fence(step_wait_event.job_id, step_wait_event.run_id);
    SELECT s.value INTO rec FROM atlantis.job_steps s
     WHERE s.job_id = step_wait_event.job_id AND s.name = step_wait_event.name;
    IF rec ? 'payload' OR rec ? 'timed_out' THEN
        delivered := rec ? 'payload'; payload := (rec->'payload')::text; wake := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT e.id, e.payload INTO ev FROM atlantis.job_events e
     WHERE e.job_id = step_wait_event.job_id AND e.event = step_wait_event.event
       AND e.consumed_at IS NULL
     ORDER BY e.id LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE atlantis.job_events e SET consumed_at = clock_timestamp(),
               consumed_by = step_wait_event.name WHERE e.id = ev.id;
        val := jsonb_build_object('event', step_wait_event.event, 'payload', ev.payload);
        delivered := true; payload := coalesce(ev.payload, 'null'::jsonb)::text; wake := NULL;
    ELSE
        deadline := CASE WHEN rec IS NOT NULL THEN (rec->>'until')::timestamptz
                         WHEN step_wait_event.seconds IS NOT NULL
                         THEN clock_timestamp() + make_interval(secs => step_wait_event.seconds) END;
        IF deadline IS NOT NULL AND deadline <= clock_timestamp() THEN
            val := jsonb_build_object('event', step_wait_event.event, 'timed_out', true,
                                      'until', deadline);
            delivered := false; payload := NULL; wake := NULL;
        ELSE
            val := jsonb_build_object('event', step_wait_event.event, 'waiting', true,
                                      'until', deadline);
            delivered := false; payload := NULL;
            wake := coalesce(deadline, '9999-12-31 00:00:00+00'::timestamptz);
        END IF;
    END IF;
    INSERT INTO atlantis.job_steps AS s (job_id, name, kind, value, bytes, run_id, attempt)
    VALUES (step_wait_event.job_id, step_wait_event.name, 'event', val, octet_length(val::text),
            step_wait_event.run_id, step_wait_event.attempt)
    ON CONFLICT (job_id, name) DO UPDATE
       SET value = excluded.value, bytes = excluded.bytes, run_id = excluded.run_id,
           attempt = excluded.attempt, recorded_at = clock_timestamp();
    RETURN NEXT;
END
$$;

-- Wake the jobs that wait for an event already sent (an event that arrived while the run
-- was suspending: its wake could not be seen yet). Each supervisor's rescue calls it.
CREATE OR REPLACE FUNCTION atlantis.event_sweep(n int) RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
    WITH due AS (
        SELECT j.id FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.suspended_for LIKE 'event:%' AND j.run_at > now()
           AND EXISTS (SELECT 1 FROM atlantis.job_events e
                        WHERE e.job_id = j.id AND e.consumed_at IS NULL
                          AND 'event:' || e.event = j.suspended_for)
         LIMIT event_sweep.n
           FOR UPDATE SKIP LOCKED
    ), woke AS (
        UPDATE atlantis.jobs j SET run_at = now() FROM due WHERE j.id = due.id RETURNING j.id
    )
    SELECT count(*) FROM woke
$$;
