-- ---- Running jobs: triggers, and helpers of the statements in queries.sql ---------------

-- Trigger jobs_notify_inserted: one NOTIFY per statement and queue, never one per row.
CREATE OR REPLACE FUNCTION atlantis.notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT queue FROM inserted WHERE state = 'available' LOOP
        PERFORM pg_notify('atlantis_jobs', q);
    END LOOP;
    RETURN NULL;
END
$$;

-- Trigger jobs_next_run: a finished job put back to `available` (a retry) starts its next
-- run (migration 0013).
CREATE OR REPLACE FUNCTION atlantis.next_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.run := OLD.run + 1;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION atlantis.next_run() FROM PUBLIC;

-- The `claim` query's statement (migration 0020): up to `n` due rows of `jobs` on `queues`
-- that no limit applies to, claimed for `worker`. A function for its SET clause alone: a
-- custom plan each call (what a prepared statement with a LIMIT parameter gets: its generic
-- plan's guess of a tenth of the table never looks cheaper) cost 0.5 ms of planning a call,
-- more than claiming 10 rows; with its plan made once, a claim of 10 rows costs the backend
-- ~40% less (benchmarks/store_cycle.py).
-- The CTE is a fence: PostgreSQL may re-run a LIMIT ... SKIP LOCKED subquery otherwise.
-- One index-ordered scan per queue (queue = one value, so jobs_fetch_free_idx returns rows in
-- order and the LIMIT stops it early, whatever n; `queue = ANY(...)` would sort every
-- waiting row). Rows marked limited (limit_group) are claim_limited's, and not in
-- jobs_fetch_free_idx. A row of a job of `limited` (those declaring limits), or on a queue
-- with a limit, that is not marked yet (enqueued as its limit was being declared) is marked
-- here, so that the limit trigger decides it.
-- args as text: the supervisor passes them to the child untouched; the child decodes them.
-- So is a workflow step's context (its predecessors' results, atlantis.step_context).
CREATE OR REPLACE FUNCTION atlantis.claim(queues text[], jobs text[], worker text, n int,
                                          limited text[])
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               trace_context jsonb, run_id uuid)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT j.id, q.limited
          FROM (SELECT u.name, EXISTS (SELECT 1 FROM atlantis.queues l
                                        WHERE l.name = u.name AND l.concurrency IS NOT NULL)
                                 AS limited
                  FROM unnest(claim.queues) AS u(name)) AS q
         CROSS JOIN LATERAL (
                SELECT x.id, x.priority, x.run_at FROM atlantis.jobs x
                 WHERE x.state = 'available' AND x.queue = q.name AND x.run_at <= now()
                   AND x.job = ANY(claim.jobs) AND x.limit_group IS NULL
                 ORDER BY x.priority, x.run_at, x.id
                 LIMIT claim.n
                   FOR UPDATE SKIP LOCKED
               ) j
         ORDER BY j.priority, j.run_at, j.id
         LIMIT claim.n
    )
    UPDATE atlantis.jobs j
       SET state = 'running', attempt = j.attempt + 1, claimed_by = claim.worker,
           claimed_until = now() + j.heartbeat, started_at = now(), progress_history = '[]',
           run_id = gen_random_uuid(), suspended_for = NULL,
           limit_group = CASE WHEN picked.limited OR j.job = ANY(claim.limited) THEN '' END
      FROM picked
     WHERE j.id = picked.id
       -- The same rows again, as a key list: the picked rows are looked up by the primary
       -- key, never found by a hash join over a scan of the whole table.
       AND j.id = ANY(ARRAY(SELECT picked.id FROM picked))
    RETURNING j.id, j.job, j.queue, j.args::text, j.run, j.attempt, j.max_attempts,
              j.cancel_requested_at IS NOT NULL,
              extract(epoch FROM j.timeout)::float8,
              extract(epoch FROM j.heartbeat)::float8,
              extract(epoch FROM j.backoff)::float8,
              now() + j.timeout, j.workflow_id,
              CASE WHEN j.workflow_id IS NULL THEN NULL
                   ELSE atlantis.step_context(j.id)::text END,
              j.trace_context, j.run_id;
END
$$;

-- One row can never stop the claims of its queue (migration 0021). A claim statement
-- (atlantis.claim, atlantis.claim_limited) that fails on one row's data fails whole, for
-- every row of its queues; the supervisor's claimer then calls this, and only then (the
-- claims themselves pay nothing for it). Each row those claims would try next (per queue,
-- the first `n` due rows no limit applies to, and the first due row of each limited group)
-- is claimed again alone, in a subtransaction rolled back whatever happens: the same SET
-- as `claim`, the same trigger, the same values returned. A row whose claim raises an error
-- of one of the SQLSTATE classes `rejected` (the errors of the row's data, as the claimer
-- classifies them) ends `dead`, error kind `claim`, its last_error naming the cause; any
-- other error is raised. Returns the rows so ended, with the cause.
CREATE OR REPLACE FUNCTION atlantis.claim_isolate(queues text[], jobs text[], worker text,
                                                  n int, limited text[], rejected text[])
RETURNS TABLE (id bigint, error text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    candidate bigint;
    probe jsonb;
    code text;
    msg text;
BEGIN
    FOR candidate IN
        SELECT c.id FROM unnest(claim_isolate.queues) AS u(q)
         CROSS JOIN LATERAL (
               SELECT x.id FROM atlantis.jobs x
                WHERE x.state = 'available' AND x.queue = u.q AND x.run_at <= now()
                  AND x.job = ANY (claim_isolate.jobs) AND x.limit_group IS NULL
                ORDER BY x.priority, x.run_at, x.id LIMIT claim_isolate.n) c
        UNION
        SELECT c.id FROM unnest(claim_isolate.queues) AS u(q)
         CROSS JOIN LATERAL (
               SELECT DISTINCT ON (x.priority, x.limit_group) x.id FROM atlantis.jobs x
                WHERE x.state = 'available' AND x.queue = u.q AND x.run_at <= now()
                  AND x.job = ANY (claim_isolate.jobs) AND x.limit_group IS NOT NULL
                ORDER BY x.priority, x.limit_group, x.run_at, x.id LIMIT 1000) c
    LOOP
        BEGIN
            PERFORM 1 FROM atlantis.jobs x
             WHERE x.id = candidate AND x.state = 'available' FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;  -- taken by a claim meanwhile
            UPDATE atlantis.jobs j
               SET state = 'running', attempt = j.attempt + 1, claimed_by = claim_isolate.worker,
                   claimed_until = now() + j.heartbeat, started_at = now(),
                   progress_history = '[]', run_id = gen_random_uuid(), suspended_for = NULL,
                   limit_group = CASE WHEN j.limit_group IS NOT NULL THEN j.limit_group
                                      WHEN j.job = ANY (claim_isolate.limited) OR EXISTS (
                                           SELECT 1 FROM atlantis.queues l
                                            WHERE l.name = j.queue AND l.concurrency IS NOT NULL)
                                      THEN '' END
             WHERE j.id = candidate
            RETURNING jsonb_build_array(j.args::text, j.run, j.attempt, j.max_attempts,
                          extract(epoch FROM j.timeout)::float8,
                          extract(epoch FROM j.heartbeat)::float8,
                          extract(epoch FROM j.backoff)::float8, now() + j.timeout,
                          CASE WHEN j.workflow_id IS NULL THEN NULL
                               ELSE atlantis.step_context(j.id)::text END, j.trace_context)
              INTO probe;
            RAISE SQLSTATE 'ATL00';  -- claimable: undo the trial
        EXCEPTION
            WHEN SQLSTATE 'ATL00' THEN
                NULL;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
                IF NOT left(code, 2) = ANY (claim_isolate.rejected) THEN
                    RAISE;
                END IF;
                msg := format('the claim cannot take this job: %s (SQLSTATE %s)',
                              left(msg, 1000), code);
                UPDATE atlantis.jobs j
                   SET state = 'dead', finished_at = now(), claimed_until = NULL,
                       last_error = msg, error_count = j.error_count + 1,
                       errors = atlantis.errors_append(j.errors, jsonb_build_object(
                           'run', j.run, 'attempt', j.attempt, 'kind', 'claim',
                           'message', msg, 'at', now(), 'worker', claim_isolate.worker))
                 WHERE j.id = candidate AND j.state = 'available';
                IF FOUND THEN
                    id := candidate;
                    error := msg;
                    RETURN NEXT;
                END IF;
        END;
    END LOOP;
END
$$;

-- Clamp a checkpoint's percentage: NaN counts as 0, infinities and out-of-range values
-- are pulled into 0..100.
CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p double precision) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p IS NULL OR p = 'NaN'::float8 THEN 0
                ELSE round(least(greatest(p, 0), 100))::smallint END
$$;

-- How long a row whose attempt failed waits before it may run again: the job's backoff
-- `base`, doubled for each failure before this one (base * 2^(failures-1)), jittered by
-- +-25%, at most `cap` (--max-backoff). The one home of the retry delay (migration 0023):
-- the finish statement applies it to an attempt the supervisor's policy failed, and the
-- rescue to a lease expiry that follows a lease expiry (queries.sql). In seconds as float8,
-- so that no exponent overflows an interval.
CREATE OR REPLACE FUNCTION atlantis.retry_delay(base interval, failures int, cap interval)
RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN base <= interval '0' OR failures <= 0 OR cap <= interval '0'
                THEN interval '0'
                ELSE make_interval(secs => least(
                         extract(epoch FROM base)::float8 * power(2::float8, least(failures - 1, 62))
                             * (0.75 + 0.5 * random()),
                         extract(epoch FROM cap)::float8)) END
$$;

-- Append one failure to a job's history, keeping the last 20.
CREATE OR REPLACE FUNCTION atlantis.errors_append(history jsonb, entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_array_length(history) < 20 THEN history || jsonb_build_array(entry)
                ELSE (history - 0) || jsonb_build_array(entry) END
$$;

-- Who cancelled a job, as every cancelled attempt's error and last_error say it: one home
-- for the text the finish, rescue and release statements (queries.sql) write. A plain SQL
-- function, IMMUTABLE: PostgreSQL inlines it, so the hot path pays nothing for the call.
CREATE OR REPLACE FUNCTION atlantis.cancel_message(by text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'cancelled by ' || coalesce(by, 'an operator') $$;

-- The error entry of an attempt ended by a cancel, as every path writes it (migration
-- 0025): an operator's atlantis.cancel and a workflow's halt (live/operators.sql, live/workflows.sql), and the
-- finish, rescue and release statements (queries.sql). The supervisor's own entry
-- (policy.cancel_error) says only kind and attempt; the finish statement completes it
-- here. Without a canceller, no `by`.
CREATE OR REPLACE FUNCTION atlantis.cancel_entry(run int, attempt int, by text) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'run', run, 'attempt', attempt, 'kind', 'cancelled',
        'message', atlantis.cancel_message(by), 'by', by))
$$;

-- Whether a failed attempt was its job's last: the row ends dead instead of going back to
-- available (migration 0025). The rescue asks it; the supervisor's policy
-- (atlantis.supervisor.policy.out_of_attempts) decides the same for the finish statement,
-- and tests/test_rules.py checks that the two agree.
CREATE OR REPLACE FUNCTION atlantis.out_of_attempts(attempt int, max_attempts int)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT attempt >= max_attempts $$;

-- A checkpoint's message as a row keeps it: its first 256 characters (atlantis/limits.py's
-- MAX_PROGRESS_MSG; the supervisor caps it the same way, policy.progress_text, before it
-- is sent; migration 0025).
CREATE OR REPLACE FUNCTION atlantis.progress_text(msg text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT left(msg, 256) $$;
