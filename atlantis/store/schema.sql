-- The atlantis schema as the migrations (0001 to 0035) and live/*.sql
-- leave it; a function's body is in live/*.sql. GENERATED, do not edit:
-- `python -m atlantis.store.schema --write` writes it, and tests/test_schema.py
-- fails when it and the migrations drift. pg_dump --schema-only --no-owner
-- --no-privileges on PostgreSQL 18, without its settings and version lines;
-- the roles' rights are granted by atlantis.store.migrate.

--
-- Name: atlantis; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA atlantis;

--
-- Name: limit_row; Type: TYPE; Schema: atlantis; Owner: -
--

CREATE TYPE atlantis.limit_row AS (
	key text,
	kind text,
	n integer,
	period interval,
	fields text[],
	val jsonb,
	scope text,
	label text,
	whole boolean
);

--
-- Name: queue_signal_row; Type: TYPE; Schema: atlantis; Owner: -
--

CREATE TYPE atlantis.queue_signal_row AS (
	queue text,
	claimable bigint,
	oldest_claimable_seconds double precision,
	running bigint,
	delayed bigint,
	limit_held bigint,
	suspended bigint,
	paused boolean,
	exact boolean
);

--
-- Name: cancel(bigint, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.cancel(job_id bigint, by text DEFAULT CURRENT_USER) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: cancel_children(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.cancel_children() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: cancel_entry(integer, integer, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.cancel_entry(run integer, attempt integer, by text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: cancel_message(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.cancel_message(by text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: cancel_workflow(bigint, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.cancel_workflow(workflow_id bigint, by text DEFAULT CURRENT_USER) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: canonical_double(numeric); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.canonical_double(n numeric) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET extra_float_digits TO '1'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: canonical_value(text, boolean, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.canonical_value(ftype text, is_array boolean, v jsonb) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: job_types; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.job_types (
    job text NOT NULL,
    queue text NOT NULL,
    max_attempts integer NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    timeout interval NOT NULL,
    heartbeat interval NOT NULL,
    backoff interval NOT NULL,
    unique_fields text[] DEFAULT '{}'::text[] NOT NULL,
    fields jsonb NOT NULL,
    source text,
    synced_at timestamp with time zone DEFAULT now() NOT NULL,
    stall interval,
    schedule text,
    tz text,
    limits jsonb DEFAULT '[]'::jsonb NOT NULL,
    overlap text,
    CONSTRAINT job_types_backoff_check CHECK ((backoff >= '00:00:00'::interval)),
    CONSTRAINT job_types_fields_check CHECK ((jsonb_typeof(fields) = 'array'::text)),
    CONSTRAINT job_types_heartbeat_check CHECK ((heartbeat > '00:00:00'::interval)),
    CONSTRAINT job_types_limits_check CHECK ((jsonb_typeof(limits) = 'array'::text)),
    CONSTRAINT job_types_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT job_types_stall_check CHECK ((stall > '00:00:00'::interval)),
    CONSTRAINT job_types_timeout_check CHECK ((timeout > '00:00:00'::interval))
);

--
-- Name: check_args(atlantis.job_types, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.check_args(decl atlantis.job_types, args jsonb) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: check_field(text, text, text, integer, boolean, jsonb, boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.check_field(job text, fname text, ftype text, flen integer, is_array boolean, v jsonb, scan boolean) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: child_ended(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.child_ended() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: claim(text[], text[], text, integer, text[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.claim(queues text[], jobs text[], worker text, n integer, limited text[]) RETURNS TABLE(id bigint, job text, queue text, args text, run integer, attempt integer, max_attempts integer, cancel_requested boolean, timeout double precision, heartbeat double precision, backoff double precision, deadline timestamp with time zone, workflow_id bigint, workflow text, trace_context jsonb, run_id uuid)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: claim_groups(text, integer, text[], text, text[], text[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.claim_groups(q text, p integer, tried text[], worker text, jobs text[], skip_jobs text[]) RETURNS TABLE(id bigint, g text)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_sort TO 'off'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: claim_in_time(timestamp with time zone); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.claim_in_time(deadline timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: claim_isolate(text[], text[], text, integer, text[], text[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.claim_isolate(queues text[], jobs text[], worker text, n integer, limited text[], rejected text[]) RETURNS TABLE(id bigint, error text)
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: claim_limited(text[], text[], text, integer, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.claim_limited(queues text[], jobs text[], worker text, n integer, after text DEFAULT NULL::text) RETURNS TABLE(id bigint, job text, queue text, args text, run integer, attempt integer, max_attempts integer, cancel_requested boolean, timeout double precision, heartbeat double precision, backoff double precision, deadline timestamp with time zone, workflow_id bigint, workflow text, wake_in double precision, cursor text, run_id uuid)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: clamp_pct(double precision); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.clamp_pct(p double precision) RETURNS smallint
    LANGUAGE sql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: clear_steps(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.clear_steps(job_id bigint) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: delete_finished(bigint[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.delete_finished(ids bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: dismiss_workflow(bigint, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.dismiss_workflow(workflow_id bigint, by text DEFAULT CURRENT_USER) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: enqueue(text, jsonb, timestamp with time zone, integer, text, interval, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.enqueue(job_name text, args jsonb DEFAULT '{}'::jsonb, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, priority integer DEFAULT NULL::integer, queue text DEFAULT NULL::text, delay interval DEFAULT NULL::interval, trace_context jsonb DEFAULT NULL::jsonb) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: enqueue_many(text, jsonb[], timestamp with time zone, integer, text, interval, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.enqueue_many(job_name text, args_list jsonb[], run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, priority integer DEFAULT NULL::integer, queue text DEFAULT NULL::text, delay interval DEFAULT NULL::interval, trace_context jsonb DEFAULT NULL::jsonb) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: enqueue_unique(atlantis.job_types, jsonb, text, integer, timestamp with time zone, boolean, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.enqueue_unique(decl atlantis.job_types, a jsonb, q text, prio integer, start_at timestamp with time zone, limited boolean, trace_context jsonb) RETURNS bigint
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: errors_append(jsonb, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.errors_append(history jsonb, entry jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: event_sweep(integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.event_sweep(n integer) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: fast_checked_args(atlantis.job_types, jsonb[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.fast_checked_args(decl atlantis.job_types, args_list jsonb[]) RETURNS jsonb[]
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: fast_field_check(text, integer, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.fast_field_check(ftype text, flen integer, v text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: job_type(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.job_type(job_name text) RETURNS atlantis.job_types
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: join_ready(bigint, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.join_ready(job_id bigint, name text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: join_sweep(integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.join_sweep(n integer) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: jsonb_depth(jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.jsonb_depth(v jsonb) RETURNS integer
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: key_digest(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.key_digest(key text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: key_text(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.key_text(key text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_claim(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_claim() RETURNS trigger
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_fields(jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_fields(limits jsonb) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_group(atlantis.job_types, jsonb, boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_group(decl atlantis.job_types, args jsonb, queue_limited boolean) RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_hold(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_hold(job_id bigint) RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_holders(atlantis.job_types, text, text, text[], jsonb, boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_holders(decl atlantis.job_types, q text, scope text, by text[], val jsonb, whole boolean) RETURNS SETOF bigint
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_mark(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_mark(job_name text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_mismatch(text, jsonb, boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_mismatch(ftype text, v jsonb, scan boolean) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_period_text(interval); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_period_text(period interval) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_refuse(text, timestamp with time zone); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_refuse(scope text, wake timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_rows(atlantis.job_types, text, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_rows(decl atlantis.job_types, q text, args jsonb) RETURNS atlantis.limit_row[]
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_sweep(integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_sweep(batch integer DEFAULT 1000) RETURNS integer
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_usage(text[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_usage(queues text[]) RETURNS TABLE(queue text, concurrency integer, running bigint, limited_running bigint, held bigint)
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limit_value(atlantis.job_types, jsonb, text[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limit_value(decl atlantis.job_types, args jsonb, by text[]) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limited_groups(text, integer, text, integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limited_groups(q text, p integer, after text, span integer) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_sort TO 'off'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limited_priority(text, integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limited_priority(q text, above integer) RETURNS integer
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limited_rows(bigint[], text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limited_rows(claimed bigint[], last text) RETURNS TABLE(id bigint, job text, queue text, args text, run integer, attempt integer, max_attempts integer, cancel_requested boolean, timeout double precision, heartbeat double precision, backoff double precision, deadline timestamp with time zone, workflow_id bigint, workflow text, wake_in double precision, cursor text)
    LANGUAGE sql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: limits_of(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.limits_of(job_id bigint) RETURNS TABLE(key text, kind text, n integer, period interval, label text)
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: max_args_bytes(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.max_args_bytes() RETURNS integer
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: next_run(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.next_run() RETURNS trigger
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: notify_inserted(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.notify_inserted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: oldest_due(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.oldest_due(q text) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: order_worker(text, text, boolean, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.order_worker(worker text, action text, exit_when_drained boolean, by text) RETURNS TABLE(id text, name text, silent boolean, in_flight integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: out_of_attempts(integer, integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.out_of_attempts(attempt integer, max_attempts integer) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: parent_live(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.parent_live(parent_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: pause(text, text, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.pause(queue text, reason text DEFAULT NULL::text, by text DEFAULT CURRENT_USER) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: progress_text(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.progress_text(msg text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: prune(interval, text[], integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.prune(older_than interval, states text[] DEFAULT ARRAY['complete'::text, 'cancelled'::text, 'dead'::text], batch integer DEFAULT 1000) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: prune_schedule_runs(interval, integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.prune_schedule_runs(older_than interval, batch integer DEFAULT 1000) RETURNS bigint
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: prune_workflows(interval, text[], integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.prune_workflows(older_than interval, states text[] DEFAULT ARRAY['complete'::text, 'cancelled'::text, 'dead'::text], batch integer DEFAULT 100) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: queue_counts(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.queue_counts(cap bigint DEFAULT 10000) RETURNS TABLE(queue text, state text, n bigint, exact boolean)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: queue_signal(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.queue_signal(queue text DEFAULT NULL::text) RETURNS SETOF atlantis.queue_signal_row
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: record_step(bigint, uuid, text, text, jsonb, integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.record_step(job_id bigint, run_id uuid, name text, kind text, value jsonb, attempt integer) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: rescue_gone(text, text, double precision); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.rescue_gone(worker text, rescuer text, max_backoff double precision) RETURNS TABLE(id bigint, state text, queue text)
    LANGUAGE sql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: rescue_message(text, boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.rescue_message(worker text, gone boolean) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: rescue_rows(bigint[], text, double precision, boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.rescue_rows(ids bigint[], rescuer text, max_backoff double precision, gone boolean) RETURNS TABLE(id bigint, state text, queue text)
    LANGUAGE sql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: resume(text, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.resume(queue text, by text DEFAULT CURRENT_USER) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: resume_worker(text, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.resume_worker(worker text, by text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: retry(bigint, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.retry(job_id bigint, by text DEFAULT CURRENT_USER) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: retry_delay(interval, integer, interval); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.retry_delay(base interval, failures integer, cap interval) RETURNS interval
    LANGUAGE sql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: retry_workflow(bigint, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.retry_workflow(workflow_id bigint, by text DEFAULT CURRENT_USER) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: row_limits(atlantis.job_types, text, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.row_limits(decl atlantis.job_types, q text, args jsonb) RETURNS TABLE(key text, kind text, n integer, period interval, fields text[], val jsonb, scope text, label text, whole boolean)
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: schedule_advance(text, timestamp with time zone, timestamp with time zone, timestamp with time zone, bigint, timestamp with time zone[], text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.schedule_advance(job_name text, after timestamp with time zone, missed_from timestamp with time zone, missed_to timestamp with time zone, missed bigint, due timestamp with time zone[], overlap text, OUT outcome text, OUT last_slot timestamp with time zone, OUT job_ids bigint[], OUT job_slots timestamp with time zone[], OUT skipped bigint, OUT open_job bigint) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: schedule_catch_up(text, timestamp with time zone, timestamp with time zone, timestamp with time zone, bigint, timestamp with time zone[]); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.schedule_catch_up(job_name text, after timestamp with time zone, missed_from timestamp with time zone, missed_to timestamp with time zone, missed bigint, due timestamp with time zone[], OUT outcome text, OUT last_slot timestamp with time zone, OUT job_ids bigint[]) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: schedule_cursor(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.schedule_cursor(job_name text) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: schedule_fire(text, timestamp with time zone, interval); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.schedule_fire(job_name text, slot timestamp with time zone, grace interval, OUT outcome text, OUT job_id bigint) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: schedules; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.schedules (
    job text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    changed_by text,
    changed_at timestamp with time zone,
    enabled_from timestamp with time zone,
    skipped bigint DEFAULT 0 NOT NULL,
    last_skipped timestamp with time zone,
    open_from timestamp with time zone
);

--
-- Name: schedule_lock(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.schedule_lock(job_name text) RETURNS atlantis.schedules
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: schedule_open_run(text, timestamp with time zone); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.schedule_open_run(job_name text, since timestamp with time zone, OUT slot timestamp with time zone, OUT job_id bigint) RETURNS record
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: schedule_set_enabled(text, boolean, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.schedule_set_enabled(job_name text, enabled boolean, by text DEFAULT CURRENT_USER) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: send_event(bigint, text, jsonb, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.send_event(job_id bigint, event text, payload jsonb DEFAULT NULL::jsonb, by text DEFAULT CURRENT_USER) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: set_queue_limit(text, integer, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.set_queue_limit(queue text, concurrency integer, by text DEFAULT CURRENT_USER) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: signal_estimate(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.signal_estimate(filter text) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: signal_limited(text, bigint, integer, bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.signal_limited(q text, cap bigint, span integer, total bigint, OUT claimable bigint, OUT held bigint, OUT oldest timestamp with time zone, OUT exact boolean) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: signal_queues(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.signal_queues() RETURNS text[]
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: signal_room(text, text, jsonb, jsonb, jsonb, bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.signal_room(job_name text, q text, args jsonb, taken jsonb, running jsonb, in_queue bigint, OUT room bigint, OUT keys text[]) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: signal_scale(text, bigint, bigint, bigint, bigint, bigint, bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.signal_scale(q text, cap bigint, INOUT due bigint, INOUT limited bigint, INOUT later bigint, INOUT suspended bigint, INOUT running bigint, OUT exact boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: signal_waiting(text, bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.signal_waiting(q text, cap bigint, OUT due bigint, OUT limited bigint, OUT later bigint, OUT suspended bigint, OUT running bigint, OUT oldest timestamp with time zone) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'atlantis'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: spawn_rows(bigint, text, text, jsonb[], timestamp with time zone, integer, text, interval, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.spawn_rows(job_id bigint, name text, job_name text, args_list jsonb[], run_at timestamp with time zone, priority integer, queue text, delay interval, trace_context jsonb) RETURNS TABLE(child bigint, fresh boolean)
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: stall_after(text, interval); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.stall_after(job_name text, heartbeat interval) RETURNS interval
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: jobs; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.jobs (
    id bigint NOT NULL,
    job text NOT NULL,
    queue text NOT NULL,
    args jsonb DEFAULT '{}'::jsonb NOT NULL,
    state text DEFAULT 'available'::text NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    timeout interval NOT NULL,
    heartbeat interval NOT NULL,
    backoff interval NOT NULL,
    unique_key text,
    claimed_by text,
    claimed_until timestamp with time zone,
    progress_pct smallint,
    progress_msg text,
    progress_at timestamp with time zone,
    last_error text,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    cancel_requested_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    error_count integer DEFAULT 0 NOT NULL,
    progress_history jsonb DEFAULT '[]'::jsonb NOT NULL,
    retried_by text,
    retried_at timestamp with time zone,
    cancelled_by text,
    run integer DEFAULT 1 NOT NULL,
    workflow_id bigint,
    step text,
    compensation boolean DEFAULT false NOT NULL,
    result jsonb,
    limit_group text,
    trace_context jsonb,
    run_id uuid,
    suspended_for text,
    parent_id bigint,
    CONSTRAINT jobs_attempt_check CHECK (((attempt >= 0) AND (attempt <= max_attempts))),
    CONSTRAINT jobs_compensation_check CHECK (((NOT compensation) OR (workflow_id IS NOT NULL))),
    CONSTRAINT jobs_error_count_check CHECK ((error_count >= 0)),
    CONSTRAINT jobs_errors_bounded_check CHECK ((jsonb_array_length(errors) <= 20)),
    CONSTRAINT jobs_errors_check CHECK ((jsonb_typeof(errors) = 'array'::text)),
    CONSTRAINT jobs_finished_check CHECK (((state = ANY (ARRAY['complete'::text, 'dead'::text, 'cancelled'::text])) = (finished_at IS NOT NULL))),
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_progress_history_check CHECK ((jsonb_typeof(progress_history) = 'array'::text)),
    CONSTRAINT jobs_progress_msg_check CHECK ((char_length(progress_msg) <= 256)),
    CONSTRAINT jobs_progress_pct_check CHECK (((progress_pct >= 0) AND (progress_pct <= 100))),
    CONSTRAINT jobs_run_check CHECK ((run >= 1)),
    CONSTRAINT jobs_running_lease_check CHECK (((state <> 'running'::text) OR ((claimed_by IS NOT NULL) AND (claimed_until IS NOT NULL) AND (started_at IS NOT NULL)))),
    CONSTRAINT jobs_started_attempt_check CHECK (((state <> ALL (ARRAY['running'::text, 'complete'::text])) OR (attempt >= 1))),
    CONSTRAINT jobs_state_check CHECK ((state = ANY (ARRAY['available'::text, 'running'::text, 'complete'::text, 'dead'::text, 'cancelled'::text]))),
    CONSTRAINT jobs_step_check CHECK (((workflow_id IS NULL) = (step IS NULL))),
    CONSTRAINT jobs_timeout_check CHECK (((timeout > '00:00:00'::interval) AND (heartbeat > '00:00:00'::interval))),
    CONSTRAINT jobs_trace_context_check CHECK ((jsonb_typeof(trace_context) = 'object'::text))
)
WITH (fillfactor='80', autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='0');

--
-- Name: stalled(atlantis.jobs); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.stalled(j atlantis.jobs) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: start_workflow(text, jsonb, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.start_workflow(name text, args jsonb DEFAULT '{}'::jsonb, trace_context jsonb DEFAULT NULL::jsonb) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_args(text, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_args(job_name text, args jsonb) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_context(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_context(job_id bigint) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_fence(bigint, uuid); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_fence(job_id bigint, run_id uuid) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_join(bigint, uuid, text, integer, bigint[], boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_join(job_id bigint, run_id uuid, name text, attempt integer, ids bigint[], results boolean) RETURNS TABLE(id bigint, state text, result text, error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_records(bigint, uuid); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_records(job_id bigint, run_id uuid) RETURNS TABLE(name text, kind text, value text)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_sleep(bigint, uuid, text, double precision, timestamp with time zone, integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_sleep(job_id bigint, run_id uuid, name text, seconds double precision, until timestamp with time zone, attempt integer) RETURNS TABLE(wake timestamp with time zone, due boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_spawn(bigint, uuid, text, integer, text, jsonb, timestamp with time zone, integer, text, interval, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_spawn(job_id bigint, run_id uuid, name text, attempt integer, job_name text, args jsonb, run_at timestamp with time zone, priority integer, queue text, delay interval, trace_context jsonb) RETURNS TABLE(child bigint, fresh boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_spawn_many(bigint, uuid, text, integer, text, jsonb[], timestamp with time zone, integer, text, interval, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_spawn_many(job_id bigint, run_id uuid, name text, attempt integer, job_name text, args_list jsonb[], run_at timestamp with time zone, priority integer, queue text, delay interval, trace_context jsonb) RETURNS TABLE(child bigint, fresh boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: step_wait_event(bigint, uuid, text, text, double precision, integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.step_wait_event(job_id bigint, run_id uuid, name text, event text, seconds double precision, attempt integer) RETURNS TABLE(delivered boolean, payload text, wake timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: type_mismatch(text, integer, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.type_mismatch(ftype text, flen integer, v jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: unique_key(atlantis.job_types, jsonb); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.unique_key(decl atlantis.job_types, args jsonb) RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: wait_check(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.wait_check() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_instances; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.workflow_instances (
    id bigint NOT NULL,
    workflow text NOT NULL,
    args jsonb DEFAULT '{}'::jsonb NOT NULL,
    state text DEFAULT 'running'::text NOT NULL,
    unique_key text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    deadline timestamp with time zone,
    finished_at timestamp with time zone,
    error text,
    failed_step text,
    cause text,
    cancel_requested_at timestamp with time zone,
    cancelled_by text,
    retried_by text,
    retried_at timestamp with time zone,
    trace_context jsonb,
    dismissed_at timestamp with time zone,
    dismissed_by text,
    CONSTRAINT workflow_instances_cause_check CHECK ((cause = ANY (ARRAY['failed'::text, 'cancelled'::text, 'timeout'::text]))),
    CONSTRAINT workflow_instances_dismissed_check CHECK (((dismissed_at IS NULL) OR ((state = 'compensation_failed'::text) AND (dismissed_by IS NOT NULL)))),
    CONSTRAINT workflow_instances_finished_check CHECK (((state = ANY (ARRAY['complete'::text, 'failed'::text, 'cancelled'::text, 'compensation_failed'::text])) = (finished_at IS NOT NULL))),
    CONSTRAINT workflow_instances_state_cause_check CHECK ((((state = 'running'::text) = (cause IS NULL)) OR (state = 'complete'::text))),
    CONSTRAINT workflow_instances_state_check CHECK ((state = ANY (ARRAY['running'::text, 'compensating'::text, 'complete'::text, 'failed'::text, 'cancelled'::text, 'compensation_failed'::text]))),
    CONSTRAINT workflow_instances_trace_context_check CHECK ((jsonb_typeof(trace_context) = 'object'::text))
);

--
-- Name: workflow_steps; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.workflow_steps (
    workflow_id bigint NOT NULL,
    step text NOT NULL,
    ord integer NOT NULL,
    job text NOT NULL,
    after text[] DEFAULT '{}'::text[] NOT NULL,
    compensate text,
    pending integer NOT NULL,
    job_id bigint,
    comp_job_id bigint,
    CONSTRAINT workflow_steps_pending_check CHECK ((pending >= 0))
);

--
-- Name: workflow_add_step_row(atlantis.workflow_instances, atlantis.workflow_steps, boolean); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_add_step_row(w atlantis.workflow_instances, s atlantis.workflow_steps, undo boolean) RETURNS bigint
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_advance(); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_advance() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_for_operator(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_for_operator(workflow_id bigint) RETURNS atlantis.workflow_instances
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_halt(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_halt(wid bigint) RETURNS integer
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_key_holder(text, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_key_holder(workflow_name text, key text) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_settle(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_settle(wid bigint) RETURNS text
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_step_states(bigint); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_step_states(wid bigint) RETURNS TABLE(step text, ord integer, job text, after text[], compensate text, job_id bigint, comp_job_id bigint, fwd text, comp text, started boolean, settled boolean)
    LANGUAGE sql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_stop(bigint, text, text, text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_stop(wid bigint, why text, step_name text, message text) RETURNS void
    LANGUAGE plpgsql
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_sweep(integer); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_sweep(batch integer DEFAULT 100) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'atlantis', 'pg_temp'
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: workflow_types; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.workflow_types (
    workflow text NOT NULL,
    fields jsonb NOT NULL,
    unique_fields text[] DEFAULT '{}'::text[] NOT NULL,
    timeout interval,
    steps jsonb NOT NULL,
    source text,
    synced_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflow_types_fields_check CHECK ((jsonb_typeof(fields) = 'array'::text)),
    CONSTRAINT workflow_types_steps_check CHECK ((jsonb_typeof(steps) = 'array'::text)),
    CONSTRAINT workflow_types_timeout_check CHECK ((timeout > '00:00:00'::interval))
);

--
-- Name: workflow_type(text); Type: FUNCTION; Schema: atlantis; Owner: -
--

CREATE FUNCTION atlantis.workflow_type(workflow_name text) RETURNS atlantis.workflow_types
    LANGUAGE plpgsql STABLE
    AS $$ ... $$;  -- the body: atlantis/store/live

--
-- Name: attempts; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.attempts (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    worker text,
    host text,
    pid integer,
    child_pid integer,
    started_at timestamp with time zone,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    outcome text NOT NULL,
    error_kind text,
    log_lines integer DEFAULT 0 NOT NULL,
    log_dropped integer DEFAULT 0 NOT NULL,
    run integer DEFAULT 1 NOT NULL,
    warning text,
    CONSTRAINT attempts_warning_check CHECK (((warning IS NULL) OR (length(warning) <= 4096)))
);

--
-- Name: attempts_id_seq; Type: SEQUENCE; Schema: atlantis; Owner: -
--

CREATE SEQUENCE atlantis.attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: attempts_id_seq; Type: SEQUENCE OWNED BY; Schema: atlantis; Owner: -
--

ALTER SEQUENCE atlantis.attempts_id_seq OWNED BY atlantis.attempts.id;

--
-- Name: console_audit; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.console_audit (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    client text,
    label text,
    outcome text NOT NULL
);

--
-- Name: console_audit_id_seq; Type: SEQUENCE; Schema: atlantis; Owner: -
--

CREATE SEQUENCE atlantis.console_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: console_audit_id_seq; Type: SEQUENCE OWNED BY; Schema: atlantis; Owner: -
--

ALTER SEQUENCE atlantis.console_audit_id_seq OWNED BY atlantis.console_audit.id;

--
-- Name: job_events; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.job_events (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    event text NOT NULL,
    payload jsonb,
    sent_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    sent_by text,
    consumed_at timestamp with time zone,
    consumed_by text,
    CONSTRAINT job_events_event_check CHECK (((char_length(event) >= 1) AND (char_length(event) <= 200)))
);

--
-- Name: job_events_id_seq; Type: SEQUENCE; Schema: atlantis; Owner: -
--

CREATE SEQUENCE atlantis.job_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: job_events_id_seq; Type: SEQUENCE OWNED BY; Schema: atlantis; Owner: -
--

ALTER SEQUENCE atlantis.job_events_id_seq OWNED BY atlantis.job_events.id;

--
-- Name: job_rows; Type: VIEW; Schema: atlantis; Owner: -
--

CREATE VIEW atlantis.job_rows AS
 SELECT id,
    job,
    queue,
    args,
    state,
    attempt,
    max_attempts,
    priority,
    run_at,
    (EXTRACT(epoch FROM timeout))::double precision AS timeout,
    (EXTRACT(epoch FROM heartbeat))::double precision AS heartbeat,
    claimed_by,
    claimed_until,
    progress_pct,
    progress_msg,
    progress_at,
    last_error,
    errors,
    error_count,
    created_at,
    started_at,
    finished_at,
    (EXTRACT(epoch FROM backoff))::double precision AS backoff,
    unique_key,
    cancel_requested_at,
    cancelled_by,
    retried_by,
    retried_at,
    progress_history,
    (EXTRACT(epoch FROM atlantis.stall_after(job, heartbeat)))::double precision AS stall_after,
    atlantis.stalled(j.*) AS stalled,
    now() AS db_now,
    run,
    workflow_id,
    step,
    compensation,
    result,
    limit_group,
    trace_context,
    run_id,
    suspended_for,
    parent_id
   FROM atlantis.jobs j;

--
-- Name: job_steps; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.job_steps (
    job_id bigint NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    value jsonb NOT NULL,
    bytes integer NOT NULL,
    run_id uuid NOT NULL,
    attempt integer NOT NULL,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT job_steps_bytes_check CHECK ((bytes >= 0)),
    CONSTRAINT job_steps_kind_check CHECK ((kind = ANY (ARRAY['step'::text, 'transaction'::text, 'sleep'::text, 'event'::text, 'spawn'::text, 'join'::text]))),
    CONSTRAINT job_steps_name_check CHECK (((char_length(name) >= 1) AND (char_length(name) <= 200)))
);

--
-- Name: jobs_id_seq; Type: SEQUENCE; Schema: atlantis; Owner: -
--

CREATE SEQUENCE atlantis.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: jobs_id_seq; Type: SEQUENCE OWNED BY; Schema: atlantis; Owner: -
--

ALTER SEQUENCE atlantis.jobs_id_seq OWNED BY atlantis.jobs.id;

--
-- Name: limit_starts; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.limit_starts (
    key text NOT NULL,
    job_id bigint NOT NULL,
    at timestamp with time zone NOT NULL,
    until timestamp with time zone NOT NULL
);

--
-- Name: live_definitions; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.live_definitions (
    one boolean DEFAULT true NOT NULL,
    checksum text NOT NULL,
    schema_version integer NOT NULL,
    package_version text NOT NULL,
    fingerprint text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT live_definitions_one_check CHECK (one)
);

--
-- Name: logs; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.logs (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    stream text NOT NULL,
    line text NOT NULL,
    run integer DEFAULT 1 NOT NULL,
    CONSTRAINT logs_stream_check CHECK ((stream = ANY (ARRAY['stdout'::text, 'stderr'::text])))
);

--
-- Name: logs_id_seq; Type: SEQUENCE; Schema: atlantis; Owner: -
--

CREATE SEQUENCE atlantis.logs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: logs_id_seq; Type: SEQUENCE OWNED BY; Schema: atlantis; Owner: -
--

ALTER SEQUENCE atlantis.logs_id_seq OWNED BY atlantis.logs.id;

--
-- Name: queues; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.queues (
    name text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    reason text,
    changed_by text,
    changed_at timestamp with time zone DEFAULT now() NOT NULL,
    concurrency integer,
    limit_by text,
    limit_at timestamp with time zone,
    CONSTRAINT queues_concurrency_check CHECK ((concurrency >= 1))
);

--
-- Name: schedule_runs; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.schedule_runs (
    job text NOT NULL,
    slot timestamp with time zone NOT NULL,
    job_id bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    missed bigint DEFAULT 0 NOT NULL,
    missed_from timestamp with time zone
);

--
-- Name: schema_migrations; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: settings; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.settings (
    name text NOT NULL,
    value text,
    CONSTRAINT settings_max_args_bytes_check CHECK (((name <> 'max_args_bytes'::text) OR (value IS NULL) OR (value ~ '^[0-9]{1,9}$'::text)))
);

--
-- Name: worker_orders; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.worker_orders (
    name text NOT NULL,
    worker_id text NOT NULL,
    action text NOT NULL,
    exit_when_drained boolean DEFAULT false NOT NULL,
    asked_by text NOT NULL,
    asked_at timestamp with time zone DEFAULT now() NOT NULL,
    drained_at timestamp with time zone,
    CONSTRAINT worker_orders_action_check CHECK ((action = ANY (ARRAY['drain'::text, 'evict'::text])))
);

--
-- Name: workers; Type: TABLE; Schema: atlantis; Owner: -
--

CREATE TABLE atlantis.workers (
    id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    concurrency integer NOT NULL,
    in_flight integer DEFAULT 0 NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    jobs jsonb DEFAULT '[]'::jsonb NOT NULL,
    job_types text[],
    liveness_interval double precision,
    boot_id text,
    name text
);

--
-- Name: workflow_instances_id_seq; Type: SEQUENCE; Schema: atlantis; Owner: -
--

ALTER TABLE atlantis.workflow_instances ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME atlantis.workflow_instances_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: workflows; Type: VIEW; Schema: atlantis; Owner: -
--

CREATE VIEW atlantis.workflows AS
 SELECT id,
    workflow,
    args,
    state,
    created_at,
    finished_at,
    error,
    failed_step,
    cause,
    deadline,
    cancel_requested_at,
    cancelled_by,
    retried_by,
    retried_at,
    dismissed_at,
    dismissed_by
   FROM atlantis.workflow_instances w;

--
-- Name: attempts id; Type: DEFAULT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.attempts ALTER COLUMN id SET DEFAULT nextval('atlantis.attempts_id_seq'::regclass);

--
-- Name: console_audit id; Type: DEFAULT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.console_audit ALTER COLUMN id SET DEFAULT nextval('atlantis.console_audit_id_seq'::regclass);

--
-- Name: job_events id; Type: DEFAULT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.job_events ALTER COLUMN id SET DEFAULT nextval('atlantis.job_events_id_seq'::regclass);

--
-- Name: jobs id; Type: DEFAULT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.jobs ALTER COLUMN id SET DEFAULT nextval('atlantis.jobs_id_seq'::regclass);

--
-- Name: logs id; Type: DEFAULT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.logs ALTER COLUMN id SET DEFAULT nextval('atlantis.logs_id_seq'::regclass);

--
-- Name: attempts attempts_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (id);

--
-- Name: console_audit console_audit_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.console_audit
    ADD CONSTRAINT console_audit_pkey PRIMARY KEY (id);

--
-- Name: job_events job_events_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.job_events
    ADD CONSTRAINT job_events_pkey PRIMARY KEY (id);

--
-- Name: job_steps job_steps_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.job_steps
    ADD CONSTRAINT job_steps_pkey PRIMARY KEY (job_id, name);

--
-- Name: job_types job_types_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.job_types
    ADD CONSTRAINT job_types_pkey PRIMARY KEY (job);

--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

--
-- Name: live_definitions live_definitions_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.live_definitions
    ADD CONSTRAINT live_definitions_pkey PRIMARY KEY (one);

--
-- Name: logs logs_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.logs
    ADD CONSTRAINT logs_pkey PRIMARY KEY (id);

--
-- Name: queues queues_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (name);

--
-- Name: schedule_runs schedule_runs_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.schedule_runs
    ADD CONSTRAINT schedule_runs_pkey PRIMARY KEY (job, slot);

--
-- Name: schedules schedules_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (job);

--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

--
-- Name: settings settings_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (name);

--
-- Name: worker_orders worker_orders_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.worker_orders
    ADD CONSTRAINT worker_orders_pkey PRIMARY KEY (name);

--
-- Name: workers workers_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);

--
-- Name: workflow_instances workflow_instances_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.workflow_instances
    ADD CONSTRAINT workflow_instances_pkey PRIMARY KEY (id);

--
-- Name: workflow_steps workflow_steps_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.workflow_steps
    ADD CONSTRAINT workflow_steps_pkey PRIMARY KEY (workflow_id, step);

--
-- Name: workflow_types workflow_types_pkey; Type: CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.workflow_types
    ADD CONSTRAINT workflow_types_pkey PRIMARY KEY (workflow);

--
-- Name: attempts_job_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX attempts_job_idx ON atlantis.attempts USING btree (job_id, id);

--
-- Name: console_audit_at_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX console_audit_at_idx ON atlantis.console_audit USING btree (at DESC);

--
-- Name: job_events_pending_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX job_events_pending_idx ON atlantis.job_events USING btree (job_id, event, id) WHERE (consumed_at IS NULL);

--
-- Name: jobs_children_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_children_idx ON atlantis.jobs USING btree (parent_id, state) WHERE (parent_id IS NOT NULL);

--
-- Name: jobs_fetch_free_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_fetch_free_idx ON atlantis.jobs USING btree (queue, priority, run_at, id) WHERE ((state = 'available'::text) AND (limit_group IS NULL));

--
-- Name: jobs_fetch_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_fetch_idx ON atlantis.jobs USING btree (queue, priority, run_at, id) WHERE (state = 'available'::text);

--
-- Name: jobs_finished_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_finished_idx ON atlantis.jobs USING btree (finished_at) WHERE (finished_at IS NOT NULL);

--
-- Name: jobs_lease_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_lease_idx ON atlantis.jobs USING btree (claimed_until) WHERE (state = 'running'::text);

--
-- Name: jobs_limited_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_limited_idx ON atlantis.jobs USING btree (queue, priority, limit_group, run_at, id) WHERE ((state = 'available'::text) AND (limit_group IS NOT NULL));

--
-- Name: jobs_limited_running_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_limited_running_idx ON atlantis.jobs USING btree (job, limit_group) WHERE ((state = 'running'::text) AND (limit_group IS NOT NULL));

--
-- Name: jobs_state_queue_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_state_queue_idx ON atlantis.jobs USING btree (state, queue);

--
-- Name: jobs_suspended_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_suspended_idx ON atlantis.jobs USING btree (queue) WHERE ((state = 'available'::text) AND (suspended_for IS NOT NULL));

--
-- Name: jobs_unique_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE UNIQUE INDEX jobs_unique_idx ON atlantis.jobs USING btree (job, atlantis.key_digest(unique_key)) WHERE ((unique_key IS NOT NULL) AND (state = ANY (ARRAY['available'::text, 'running'::text])));

--
-- Name: jobs_workflow_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX jobs_workflow_idx ON atlantis.jobs USING btree (workflow_id, step) WHERE (workflow_id IS NOT NULL);

--
-- Name: limit_starts_job_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX limit_starts_job_idx ON atlantis.limit_starts USING btree (job_id);

--
-- Name: limit_starts_key_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX limit_starts_key_idx ON atlantis.limit_starts USING btree (key, until);

--
-- Name: logs_job_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX logs_job_idx ON atlantis.logs USING btree (job_id, attempt, id);

--
-- Name: workflow_instances_active_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX workflow_instances_active_idx ON atlantis.workflow_instances USING btree (id) WHERE (state = 'compensating'::text);

--
-- Name: workflow_instances_deadline_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX workflow_instances_deadline_idx ON atlantis.workflow_instances USING btree (deadline) WHERE ((state = 'running'::text) AND (deadline IS NOT NULL));

--
-- Name: workflow_instances_finished_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX workflow_instances_finished_idx ON atlantis.workflow_instances USING btree (finished_at) WHERE (finished_at IS NOT NULL);

--
-- Name: workflow_instances_state_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE INDEX workflow_instances_state_idx ON atlantis.workflow_instances USING btree (state, id);

--
-- Name: workflow_instances_unique_idx; Type: INDEX; Schema: atlantis; Owner: -
--

CREATE UNIQUE INDEX workflow_instances_unique_idx ON atlantis.workflow_instances USING btree (workflow, atlantis.key_digest(unique_key)) WHERE ((unique_key IS NOT NULL) AND (dismissed_at IS NULL) AND (state = ANY (ARRAY['running'::text, 'compensating'::text, 'compensation_failed'::text])));

--
-- Name: jobs_state_queue_stats; Type: STATISTICS; Schema: atlantis; Owner: -
--

CREATE STATISTICS atlantis.jobs_state_queue_stats (mcv) ON queue, state FROM atlantis.jobs;

--
-- Name: jobs jobs_cancel_children; Type: TRIGGER; Schema: atlantis; Owner: -
--

CREATE TRIGGER jobs_cancel_children AFTER UPDATE OF state, cancel_requested_at ON atlantis.jobs FOR EACH ROW WHEN ((((new.state = 'cancelled'::text) AND (old.state <> 'cancelled'::text)) OR ((new.cancel_requested_at IS NOT NULL) AND (old.cancel_requested_at IS NULL)))) EXECUTE FUNCTION atlantis.cancel_children();

--
-- Name: jobs jobs_child_end; Type: TRIGGER; Schema: atlantis; Owner: -
--

CREATE TRIGGER jobs_child_end AFTER UPDATE OF state ON atlantis.jobs FOR EACH ROW WHEN (((new.parent_id IS NOT NULL) AND (old.state = ANY (ARRAY['available'::text, 'running'::text])) AND (new.state = ANY (ARRAY['complete'::text, 'dead'::text, 'cancelled'::text])))) EXECUTE FUNCTION atlantis.child_ended();

--
-- Name: jobs jobs_limit_claim; Type: TRIGGER; Schema: atlantis; Owner: -
--

CREATE TRIGGER jobs_limit_claim BEFORE UPDATE OF state ON atlantis.jobs FOR EACH ROW WHEN (((new.state = 'running'::text) AND (old.state <> 'running'::text) AND (new.limit_group IS NOT NULL))) EXECUTE FUNCTION atlantis.limit_claim();

--
-- Name: jobs jobs_next_run; Type: TRIGGER; Schema: atlantis; Owner: -
--

CREATE TRIGGER jobs_next_run BEFORE UPDATE OF state ON atlantis.jobs FOR EACH ROW WHEN (((old.state = ANY (ARRAY['dead'::text, 'cancelled'::text])) AND (new.state = 'available'::text))) EXECUTE FUNCTION atlantis.next_run();

--
-- Name: jobs jobs_notify_inserted; Type: TRIGGER; Schema: atlantis; Owner: -
--

CREATE TRIGGER jobs_notify_inserted AFTER INSERT ON atlantis.jobs REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION atlantis.notify_inserted();

--
-- Name: jobs jobs_wait_check; Type: TRIGGER; Schema: atlantis; Owner: -
--

CREATE TRIGGER jobs_wait_check AFTER UPDATE OF suspended_for ON atlantis.jobs FOR EACH ROW WHEN (((new.state = 'available'::text) AND ((new.suspended_for ~~ 'event:%'::text) OR (new.suspended_for ~~ 'join:%'::text)))) EXECUTE FUNCTION atlantis.wait_check();

--
-- Name: jobs jobs_workflow_advance; Type: TRIGGER; Schema: atlantis; Owner: -
--

CREATE TRIGGER jobs_workflow_advance AFTER UPDATE OF state ON atlantis.jobs FOR EACH ROW WHEN (((new.workflow_id IS NOT NULL) AND (old.state IS DISTINCT FROM new.state) AND (new.state <> 'running'::text))) EXECUTE FUNCTION atlantis.workflow_advance();

--
-- Name: job_events job_events_job_id_fkey; Type: FK CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.job_events
    ADD CONSTRAINT job_events_job_id_fkey FOREIGN KEY (job_id) REFERENCES atlantis.jobs(id) ON DELETE CASCADE;

--
-- Name: job_steps job_steps_job_id_fkey; Type: FK CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.job_steps
    ADD CONSTRAINT job_steps_job_id_fkey FOREIGN KEY (job_id) REFERENCES atlantis.jobs(id) ON DELETE CASCADE;

--
-- Name: workflow_steps workflow_steps_workflow_id_fkey; Type: FK CONSTRAINT; Schema: atlantis; Owner: -
--

ALTER TABLE ONLY atlantis.workflow_steps
    ADD CONSTRAINT workflow_steps_workflow_id_fkey FOREIGN KEY (workflow_id) REFERENCES atlantis.workflow_instances(id) ON DELETE CASCADE;
