-- Concurrency and rate limits (issue 21), held by the database for every claimer: a row of
-- a limited job turns `running` only through the BEFORE UPDATE trigger jobs_limit_claim,
-- which counts, under a transaction-scoped advisory lock per limit key, what runs or
-- started, and leaves the row `available` when a limit is full. The functions' bodies live
-- in atlantis/store/live/*.sql; here they are created with their signatures.

-- The declared limits of a job, in declaration order: {"kind": "concurrency", "n", "by"} or
-- {"kind": "rate", "n", "period" (seconds), "by"}.
ALTER TABLE atlantis.job_types
    ADD COLUMN limits jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(limits) = 'array');

-- A queue-wide concurrency limit set at run time (tide queue limit).
ALTER TABLE atlantis.queues
    ADD COLUMN concurrency int CHECK (concurrency >= 1),
    ADD COLUMN limit_by text,
    ADD COLUMN limit_at timestamptz;

-- NULL on a row no limit applies to (the trigger never fires for it). Otherwise the row's
-- group, the canonical values of its job's `by` fields ('' when none): claims take turns
-- among groups.
ALTER TABLE atlantis.jobs ADD COLUMN limit_group text;

-- The claim of rows no limit applies to never meets a limited one: a backlog held by a
-- limit costs it nothing. jobs_fetch_idx (every waiting row) stays for the claims of
-- supervisors of the previous release while a fleet rolls; the next release drops it.
CREATE INDEX jobs_fetch_free_idx ON atlantis.jobs (queue, priority, run_at, id)
    WHERE state = 'available' AND limit_group IS NULL;
-- Waiting rows of limited jobs, by priority and group: the claim of limited rows walks the
-- groups of each priority.
CREATE INDEX jobs_limited_idx ON atlantis.jobs (queue, priority, limit_group, run_at, id)
    WHERE state = 'available' AND limit_group IS NOT NULL;
-- Running rows of limited jobs: what a job's concurrency limit counts.
CREATE INDEX jobs_limited_running_idx ON atlantis.jobs (job, limit_group)
    WHERE state = 'running' AND limit_group IS NOT NULL;

-- One row per attempt of a rate-limited job started, per rate key, until its window ends.
CREATE TABLE atlantis.limit_starts (
    key text NOT NULL,
    job_id bigint NOT NULL,
    at timestamptz NOT NULL,
    until timestamptz NOT NULL
);
CREATE INDEX limit_starts_key_idx ON atlantis.limit_starts (key, until);
CREATE INDEX limit_starts_job_idx ON atlantis.limit_starts (job_id);

-- atlantis.job_rows (migration 0017) with the row's limit group appended.
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
       j.workflow_id, j.step, j.compensation, j.result, j.limit_group
  FROM atlantis.jobs j;

-- The functions, with placeholder bodies: atlantis/store/live/*.sql defines them.
CREATE FUNCTION atlantis.limit_value(decl atlantis.job_types, args jsonb, by text[]) RETURNS jsonb
LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE FUNCTION atlantis.limit_fields(limits jsonb) RETURNS text[]
LANGUAGE sql AS $$ SELECT NULL::text[] $$;
CREATE FUNCTION atlantis.limit_group(decl atlantis.job_types, args jsonb, queue_limited boolean)
RETURNS text LANGUAGE sql AS $$ SELECT NULL::text $$;
CREATE FUNCTION atlantis.limit_period_text(period interval) RETURNS text
LANGUAGE sql AS $$ SELECT NULL::text $$;
-- One limit that applies to a row (atlantis.row_limits' rows).
CREATE TYPE atlantis.limit_row AS (key text, kind text, n int, period interval, fields text[],
                                   val jsonb, scope text, label text, whole boolean);
CREATE FUNCTION atlantis.limit_rows(decl atlantis.job_types, q text, args jsonb)
RETURNS atlantis.limit_row[] LANGUAGE sql AS $$ SELECT '{}'::atlantis.limit_row[] $$;
CREATE FUNCTION atlantis.row_limits(decl atlantis.job_types, q text, args jsonb)
RETURNS TABLE (key text, kind text, n int, period interval, fields text[], val jsonb, scope text,
               label text, whole boolean)
LANGUAGE sql AS $$ SELECT NULL::text, NULL::text, 0, NULL::interval, NULL::text[], NULL::jsonb,
                          NULL::text, NULL::text, false WHERE false $$;
CREATE FUNCTION atlantis.limit_holders(decl atlantis.job_types, q text, scope text, by text[],
                                       val jsonb, whole boolean) RETURNS SETOF bigint
LANGUAGE sql AS $$ SELECT 0::bigint WHERE false $$;
CREATE FUNCTION atlantis.limit_refuse(scope text, wake timestamptz) RETURNS boolean
LANGUAGE sql AS $$ SELECT false $$;
CREATE FUNCTION atlantis.limit_claim() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE FUNCTION atlantis.claim_limited(queues text[], jobs text[], worker text, n int,
                                       after text DEFAULT NULL)
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               wake_in float8, cursor text)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, 0, 0, 0, false,
                          0::float8, 0::float8, 0::float8, NULL::timestamptz, NULL::bigint,
                          NULL::text, NULL::float8, NULL::text WHERE false $$;
CREATE FUNCTION atlantis.limits_of(job_id bigint)
RETURNS TABLE (key text, kind text, n int, period interval, label text)
LANGUAGE sql AS $$ SELECT NULL::text, NULL::text, 0, NULL::interval, NULL::text WHERE false $$;
CREATE FUNCTION atlantis.limit_hold(job_id bigint) RETURNS text
LANGUAGE sql AS $$ SELECT NULL::text $$;
CREATE FUNCTION atlantis.limit_mark(job_name text) RETURNS bigint
LANGUAGE sql AS $$ SELECT 0::bigint $$;
CREATE FUNCTION atlantis.set_queue_limit(queue text, concurrency int,
                                         by text DEFAULT current_user) RETURNS int
LANGUAGE sql AS $$ SELECT NULL::int $$;
CREATE FUNCTION atlantis.limit_usage(queues text[])
RETURNS TABLE (queue text, concurrency int, running bigint, limited_running bigint, held bigint)
LANGUAGE sql AS $$ SELECT NULL::text, 0, 0::bigint, 0::bigint, 0::bigint WHERE false $$;
CREATE FUNCTION atlantis.limit_sweep(batch int DEFAULT 1000) RETURNS int
LANGUAGE sql AS $$ SELECT 0 $$;

-- Every claimer obeys the limits, whatever SQL it claims with: a supervisor of the previous
-- release too. Only rows marked limited fire it.
CREATE TRIGGER jobs_limit_claim BEFORE UPDATE OF state ON atlantis.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'running' AND OLD.state <> 'running' AND NEW.limit_group IS NOT NULL)
    EXECUTE FUNCTION atlantis.limit_claim();

REVOKE ALL ON FUNCTION atlantis.limit_claim() FROM PUBLIC;
