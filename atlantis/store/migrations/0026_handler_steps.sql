-- Handler steps (issue 34): what a handler's ctx.run_step, ctx.transaction and ctx.sleep
-- recorded, kept across the job's runs; a run id for every claim, which the child's writes
-- are fenced on; and what a suspended (sleeping) job waits for. The bodies of the functions
-- live in atlantis/store/live/steps.sql and live/claims.sql.

-- One id per claim (a "run" of the handler: from a claim to its end), random so that a
-- handler's connection cannot guess another run's. A resume spends no attempt, so
-- (id, run, attempt, claimed_by) may repeat across two claims; the run id never does.
ALTER TABLE atlantis.jobs ADD COLUMN run_id uuid;
-- What an `available` job that suspended itself waits for (`sleep:<step>`), until its
-- run_at; NULL otherwise. Meaningful only while the row is `available`.
ALTER TABLE atlantis.jobs ADD COLUMN suspended_for text;

-- The metrics' count of sleeping jobs (few rows: a small index).
CREATE INDEX jobs_suspended_idx ON atlantis.jobs (queue)
    WHERE state = 'available' AND suspended_for IS NOT NULL;

CREATE TABLE atlantis.job_steps (
    job_id      bigint NOT NULL REFERENCES atlantis.jobs (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    kind        text NOT NULL CHECK (kind IN ('step', 'transaction', 'sleep')),
    value       jsonb NOT NULL,
    bytes       int NOT NULL CHECK (bytes >= 0),
    run_id      uuid NOT NULL,
    attempt     int NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, name)
);

-- The claims return the run id: their result type changes, so they are made anew (the
-- bodies are the live ones). A release one behind selects its columns by name.
DROP FUNCTION atlantis.claim(text[], text[], text, int, text[]);
CREATE FUNCTION atlantis.claim(queues text[], jobs text[], worker text, n int, limited text[])
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               trace_context jsonb, run_id uuid)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;

DROP FUNCTION atlantis.claim_limited(text[], text[], text, int, text);
CREATE FUNCTION atlantis.claim_limited(queues text[], jobs text[], worker text, n int,
                                       after text DEFAULT NULL)
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               wake_in float8, cursor text, run_id uuid)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;

CREATE FUNCTION atlantis.step_fence(job_id bigint, run_id uuid) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN END $$;
CREATE FUNCTION atlantis.step_records(job_id bigint, run_id uuid)
RETURNS TABLE (name text, kind text, value text)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;
CREATE FUNCTION atlantis.record_step(job_id bigint, run_id uuid, name text, kind text,
                                     value jsonb, attempt int)
RETURNS timestamptz LANGUAGE sql AS $$ SELECT NULL::timestamptz $$;
CREATE FUNCTION atlantis.step_sleep(job_id bigint, run_id uuid, name text, seconds float8,
                                    until timestamptz, attempt int)
RETURNS TABLE (wake timestamptz, due boolean)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;
CREATE FUNCTION atlantis.clear_steps(job_id bigint) RETURNS bigint
LANGUAGE sql AS $$ SELECT 0::bigint $$;

-- atlantis.job_rows shows the two new columns (appended: a release one behind reads its own
-- by name). The query is the live one's (live/views.sql).
CREATE OR REPLACE VIEW atlantis.job_rows AS
SELECT j.id, j.job, j.queue, j.args, j.state, j.attempt, j.max_attempts, j.priority, j.run_at,
       extract(epoch FROM j.timeout)::float8 AS timeout,
       extract(epoch FROM j.heartbeat)::float8 AS heartbeat,
       j.claimed_by, j.claimed_until, j.progress_pct, j.progress_msg, j.progress_at,
       j.last_error, j.errors, j.error_count, j.created_at, j.started_at, j.finished_at,
       extract(epoch FROM j.backoff)::float8 AS backoff, j.unique_key, j.cancel_requested_at,
       j.cancelled_by, j.retried_by, j.retried_at, j.progress_history,
       extract(epoch FROM atlantis.stall_after(j.job, j.heartbeat))::float8 AS stall_after,
       atlantis.stalled(j) AS stalled, now() AS db_now, j.run,
       j.workflow_id, j.step, j.compensation, j.result, j.limit_group, j.trace_context,
       j.run_id, j.suspended_for
  FROM atlantis.jobs j;
