-- The store's CPU per job (issue 23): the `claim` query calls atlantis.claim, which runs
-- the statement it ran with a plan made once a session (plan_cache_mode =
-- force_generic_plan) instead of a custom plan each call. The body lives in atlantis/store/live/*.sql;
-- a supervisor of the previous release keeps running its own statement, unchanged.
CREATE FUNCTION atlantis.claim(queues text[], jobs text[], worker text, n int,
                               limited text[])
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               trace_context jsonb)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, 0, 0, 0, false,
                          0::float8, 0::float8, 0::float8, NULL::timestamptz, NULL::bigint,
                          NULL::text, NULL::jsonb WHERE false $$;
REVOKE ALL ON FUNCTION atlantis.claim(text[], text[], text, int, text[]) FROM PUBLIC;
