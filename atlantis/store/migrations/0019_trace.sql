-- OpenTelemetry (issue 22): the W3C trace context of the code that enqueued a job, as the
-- propagator wrote it ({"traceparent": "...", "tracestate": "..."}), kept in its row; the
-- supervisor makes each attempt's span a child of it. NULL when the enqueuer traced nothing
-- (no OpenTelemetry installed, or no span recording): what every SQL caller gets.
ALTER TABLE atlantis.jobs
    ADD COLUMN trace_context jsonb CHECK (jsonb_typeof(trace_context) = 'object');

-- enqueue_many and enqueue take the context as a last, defaulted argument: every call made
-- before (SQL callers, the schedules' functions, the previous release's named query) still
-- resolves to them. A new argument is a new signature, so the old ones go first (two
-- overloads would make those calls ambiguous). The bodies live in atlantis/store/live/*.sql.
DROP FUNCTION atlantis.enqueue(text, jsonb, timestamptz, int, text, interval);
DROP FUNCTION atlantis.enqueue_many(text, jsonb[], timestamptz, int, text, interval);
CREATE FUNCTION atlantis.enqueue_many(
    job_name text,
    args_list jsonb[],
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT NULL,
    queue text DEFAULT NULL,
    delay interval DEFAULT NULL,
    trace_context jsonb DEFAULT NULL
) RETURNS bigint[]
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$ SELECT '{}'::bigint[] $$;
CREATE FUNCTION atlantis.enqueue(
    job_name text,
    args jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT NULL,
    queue text DEFAULT NULL,
    delay interval DEFAULT NULL,
    trace_context jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$ SELECT NULL::bigint $$;
REVOKE ALL ON FUNCTION atlantis.enqueue_many(text, jsonb[], timestamptz, int, text, interval,
                                             jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION atlantis.enqueue(text, jsonb, timestamptz, int, text, interval, jsonb)
    FROM PUBLIC;

-- A workflow keeps the context of its start, and each of its steps' rows (compensations
-- included) gets it: the steps' attempts are children of the span that started it.
ALTER TABLE atlantis.workflow_instances
    ADD COLUMN trace_context jsonb CHECK (jsonb_typeof(trace_context) = 'object');
DROP FUNCTION atlantis.start_workflow(text, jsonb);
CREATE FUNCTION atlantis.start_workflow(name text, args jsonb DEFAULT '{}',
                                        trace_context jsonb DEFAULT NULL) RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$ SELECT NULL::bigint $$;
REVOKE ALL ON FUNCTION atlantis.start_workflow(text, jsonb, jsonb) FROM PUBLIC;

-- atlantis.job_rows (migration 0018) with the row's trace context appended: `tide job status
-- --json`, the listings and the console show every column of atlantis.jobs.
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
       j.workflow_id, j.step, j.compensation, j.result, j.limit_group, j.trace_context
  FROM atlantis.jobs j;
