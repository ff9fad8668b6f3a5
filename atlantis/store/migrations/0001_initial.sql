-- atlantis schema, version 1.
-- Applied by atlantis.store.migrate inside one transaction holding an advisory lock.

CREATE TABLE atlantis.job_types (
    job           text PRIMARY KEY,
    queue         text NOT NULL,
    max_attempts  int NOT NULL CHECK (max_attempts >= 1),
    priority      int NOT NULL DEFAULT 0,
    timeout       interval NOT NULL CHECK (timeout > interval '0'),
    heartbeat     interval NOT NULL CHECK (heartbeat > interval '0'),
    backoff       interval NOT NULL CHECK (backoff >= interval '0'),
    unique_fields text[] NOT NULL DEFAULT '{}',
    fields        jsonb NOT NULL CHECK (jsonb_typeof(fields) = 'array'),
    source        text,
    synced_at     timestamptz NOT NULL DEFAULT now()
);

CREATE SEQUENCE atlantis.jobs_id_seq AS bigint;

CREATE TABLE atlantis.jobs (
    id                  bigint PRIMARY KEY DEFAULT nextval('atlantis.jobs_id_seq'),
    job                 text NOT NULL,
    queue               text NOT NULL,
    args                jsonb NOT NULL DEFAULT '{}',
    state               text NOT NULL DEFAULT 'available',
    attempt             int NOT NULL DEFAULT 0,
    max_attempts        int NOT NULL,
    priority            int NOT NULL DEFAULT 0,
    run_at              timestamptz NOT NULL DEFAULT now(),
    timeout             interval NOT NULL,
    heartbeat           interval NOT NULL,
    backoff             interval NOT NULL,
    unique_key          text,
    claimed_by          text,
    claimed_until       timestamptz,
    progress_pct        smallint,
    progress_msg        text,
    progress_at         timestamptz,
    last_error          text,
    errors              jsonb NOT NULL DEFAULT '[]',
    cancel_requested_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    CONSTRAINT jobs_state_check
        CHECK (state IN ('available', 'running', 'complete', 'dead', 'cancelled')),
    CONSTRAINT jobs_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT jobs_attempt_check CHECK (attempt >= 0 AND attempt <= max_attempts),
    CONSTRAINT jobs_started_attempt_check
        CHECK (state NOT IN ('running', 'complete') OR attempt >= 1),
    CONSTRAINT jobs_running_lease_check
        CHECK (state <> 'running'
               OR (claimed_by IS NOT NULL AND claimed_until IS NOT NULL AND started_at IS NOT NULL)),
    CONSTRAINT jobs_finished_check
        CHECK ((state IN ('complete', 'dead', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_progress_pct_check CHECK (progress_pct BETWEEN 0 AND 100),
    CONSTRAINT jobs_progress_msg_check CHECK (char_length(progress_msg) <= 256),
    CONSTRAINT jobs_errors_check CHECK (jsonb_typeof(errors) = 'array'),
    CONSTRAINT jobs_timeout_check CHECK (timeout > interval '0' AND heartbeat > interval '0')
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

ALTER SEQUENCE atlantis.jobs_id_seq OWNED BY atlantis.jobs.id;

-- Runnable rows only: what claims scan.
CREATE INDEX jobs_fetch_idx ON atlantis.jobs (queue, priority, run_at, id)
    WHERE state = 'available';
-- Leases: what rescue scans.
CREATE INDEX jobs_lease_idx ON atlantis.jobs (claimed_until) WHERE state = 'running';
-- `unique (field, ...)`: at most one available-or-running job per key.
CREATE UNIQUE INDEX jobs_unique_idx ON atlantis.jobs (job, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'running');
CREATE INDEX jobs_state_queue_idx ON atlantis.jobs (state, queue);

CREATE TABLE atlantis.workers (
    id          text PRIMARY KEY,
    host        text NOT NULL,
    pid         int NOT NULL,
    queues      text[] NOT NULL,
    concurrency int NOT NULL,
    in_flight   int NOT NULL DEFAULT 0,
    status      text NOT NULL DEFAULT 'running',
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

-- One NOTIFY per statement and queue, never one per row.
CREATE FUNCTION atlantis.notify_inserted() RETURNS trigger
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

CREATE TRIGGER jobs_notify_inserted
    AFTER INSERT ON atlantis.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION atlantis.notify_inserted();

-- Clamp a checkpoint's percentage: NaN counts as 0, infinities and out-of-range values
-- are pulled into 0..100.
CREATE FUNCTION atlantis.clamp_pct(p double precision) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p IS NULL OR p = 'NaN'::float8 THEN 0
                ELSE round(least(greatest(p, 0), 100))::smallint END
$$;

-- Delay before attempt `attempt + 1`: base * 2^(attempt-1), jittered by +-25%, capped at a day.
CREATE FUNCTION atlantis.retry_delay(base interval, attempt int) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT least(base * power(2, greatest(attempt - 1, 0))::float8 * (0.75 + random() * 0.5),
                 interval '1 day')
$$;

-- Validate one value against a declared scalar type; returns the reason it does not fit,
-- or NULL when it fits.
CREATE FUNCTION atlantis.type_mismatch(ftype text, flen int, v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t text := jsonb_typeof(v);
    n numeric;
    s text;
    ok boolean;
BEGIN
    IF t = 'null' THEN
        RETURN NULL;
    END IF;
    CASE ftype
    WHEN 'text' THEN
        IF t <> 'string' THEN RETURN format('expected text, got %s', t); END IF;
    WHEN 'varchar' THEN
        IF t <> 'string' THEN RETURN format('expected varchar(%s), got %s', flen, t); END IF;
        s := v #>> '{}';
        IF char_length(s) > flen THEN
            RETURN format('value of %s characters is longer than varchar(%s)', char_length(s), flen);
        END IF;
    WHEN 'int', 'bigint' THEN
        IF t <> 'number' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
        n := (v #>> '{}')::numeric;
        IF n <> trunc(n) THEN RETURN format('expected %s, got %s', ftype, n); END IF;
        IF ftype = 'int' AND (n < -2147483648 OR n > 2147483647) THEN
            RETURN format('%s is out of range for int', n);
        END IF;
        IF n < -9223372036854775808 OR n > 9223372036854775807 THEN
            RETURN format('%s is out of range for bigint', n);
        END IF;
    WHEN 'double', 'numeric' THEN
        IF t <> 'number' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
    WHEN 'boolean' THEN
        IF t <> 'boolean' THEN RETURN format('expected boolean, got %s', t); END IF;
    WHEN 'uuid', 'timestamptz', 'date' THEN
        IF t <> 'string' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
        s := v #>> '{}';
        -- One call site per type: pg_input_is_valid caches the type it looked up last.
        ok := CASE ftype WHEN 'uuid' THEN pg_input_is_valid(s, 'uuid')
                         WHEN 'timestamptz' THEN pg_input_is_valid(s, 'timestamptz')
                         ELSE pg_input_is_valid(s, 'date') END;
        IF NOT ok THEN
            RETURN format('%s is not a valid %s', left(v::text, 80), ftype);
        END IF;
    WHEN 'jsonb' THEN
        RETURN NULL;
    ELSE
        RETURN format('unknown type %s', ftype);
    END CASE;
    RETURN NULL;
END
$$;

-- Check `args` against the declaration of `decl`; returns the args with defaults filled in.
-- Raises SQLSTATE ATL02 naming the job and the field.
CREATE FUNCTION atlantis.check_args(decl atlantis.job_types, args jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f jsonb;
    fname text;
    v jsonb;
    why text;
    elem jsonb;
    i int;
    out jsonb := '{}';
    limit_bytes int := coalesce(nullif(current_setting('atlantis.max_args_bytes', true), '')::int,
                                1048576);
    extra text;
BEGIN
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'job %: args must be a JSON object, got %', decl.job,
            coalesce(jsonb_typeof(args), 'nothing') USING ERRCODE = 'ATL02';
    END IF;
    IF octet_length(args::text) > limit_bytes THEN
        RAISE EXCEPTION 'job %: args are % bytes, larger than the limit of % bytes', decl.job,
            octet_length(args::text), limit_bytes USING ERRCODE = 'ATL02';
    END IF;
    SELECT k INTO extra FROM jsonb_object_keys(args) AS k
     WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(decl.fields) d WHERE d->>'name' = k)
     ORDER BY k LIMIT 1;
    IF extra IS NOT NULL THEN
        RAISE EXCEPTION 'job %: unknown field %', decl.job, extra USING ERRCODE = 'ATL02';
    END IF;
    FOR f IN SELECT * FROM jsonb_array_elements(decl.fields) LOOP
        fname := f->>'name';
        IF args ? fname THEN
            v := args->fname;
        ELSIF (f->>'has_default')::boolean THEN
            v := f->'default';
        ELSE
            v := 'null';
        END IF;
        IF jsonb_typeof(v) = 'null' AND (f->>'not_null')::boolean THEN
            RAISE EXCEPTION 'job %: field % is required (declared not null)', decl.job, fname
                USING ERRCODE = 'ATL02';
        END IF;
        IF (f->>'array')::boolean AND jsonb_typeof(v) <> 'null' THEN
            IF jsonb_typeof(v) <> 'array' THEN
                RAISE EXCEPTION 'job %: field %: expected an array, got %', decl.job, fname,
                    jsonb_typeof(v) USING ERRCODE = 'ATL02';
            END IF;
            i := 0;
            FOR elem IN SELECT * FROM jsonb_array_elements(v) LOOP
                why := atlantis.type_mismatch(f->>'type', (f->>'length')::int, elem);
                IF why IS NOT NULL THEN
                    RAISE EXCEPTION 'job %: field %[%]: %', decl.job, fname, i, why
                        USING ERRCODE = 'ATL02';
                END IF;
                i := i + 1;
            END LOOP;
        ELSE
            why := atlantis.type_mismatch(f->>'type', (f->>'length')::int, v);
            IF why IS NOT NULL THEN
                RAISE EXCEPTION 'job %: field %: %', decl.job, fname, why USING ERRCODE = 'ATL02';
            END IF;
        END IF;
        out := out || jsonb_build_object(fname, v);
    END LOOP;
    RETURN out;
END
$$;

CREATE FUNCTION atlantis.job_type(job_name text) RETURNS atlantis.job_types
LANGUAGE plpgsql STABLE AS $$
DECLARE
    decl atlantis.job_types;
BEGIN
    SELECT * INTO decl FROM atlantis.job_types WHERE job = job_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown job %', job_name
            USING ERRCODE = 'ATL01',
                  HINT = 'sync the declarations into the database: tide db sync --app '
                         'package.module:registry (atlantis-supervise does it at start)';
    END IF;
    RETURN decl;
END
$$;

-- Enqueue a batch of one job; returns the ids in the order of `args_list`.
-- A job declared `unique (...)` returns the existing id for a key already available or running.
CREATE FUNCTION atlantis.enqueue_many(
    job_name text,
    args_list jsonb[],
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT NULL,
    queue text DEFAULT NULL,
    delay interval DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    decl atlantis.job_types := atlantis.job_type(job_name);
    start_at timestamptz := coalesce(run_at, now() + coalesce(delay, interval '0'));
    ids bigint[];
    a jsonb;
    key text;
    new_id bigint;
BEGIN
    IF cardinality(decl.unique_fields) = 0 THEN
        WITH input AS (
            SELECT nextval('atlantis.jobs_id_seq') AS id, atlantis.check_args(decl, x) AS args, ord
              FROM unnest(args_list) WITH ORDINALITY AS u(x, ord)
        ), ins AS (
            INSERT INTO atlantis.jobs (id, job, queue, args, max_attempts, priority, run_at,
                                       timeout, heartbeat, backoff)
            SELECT input.id, decl.job, coalesce(enqueue_many.queue, decl.queue), input.args,
                   decl.max_attempts, coalesce(enqueue_many.priority, decl.priority), start_at,
                   decl.timeout, decl.heartbeat, decl.backoff
              FROM input
        )
        -- A data-modifying CTE always runs; `input` is computed once for both uses.
        SELECT array_agg(input.id ORDER BY input.ord) INTO ids FROM input;
        RETURN coalesce(ids, '{}');
    END IF;
    ids := '{}';
    FOREACH a IN ARRAY args_list LOOP
        a := atlantis.check_args(decl, a);
        SELECT jsonb_agg(a->u ORDER BY o)::text INTO key
          FROM unnest(decl.unique_fields) WITH ORDINALITY AS t(u, o);
        LOOP
            INSERT INTO atlantis.jobs (job, queue, args, max_attempts, priority, run_at,
                                       timeout, heartbeat, backoff, unique_key)
            VALUES (decl.job, coalesce(enqueue_many.queue, decl.queue), a, decl.max_attempts,
                    coalesce(enqueue_many.priority, decl.priority), start_at, decl.timeout,
                    decl.heartbeat, decl.backoff, key)
            ON CONFLICT (job, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('available', 'running')
                DO NOTHING
            RETURNING id INTO new_id;
            IF new_id IS NULL THEN
                SELECT j.id INTO new_id FROM atlantis.jobs j
                 WHERE j.job = decl.job AND j.unique_key = key
                   AND j.state IN ('available', 'running');
            END IF;
            EXIT WHEN new_id IS NOT NULL;
        END LOOP;
        ids := ids || new_id;
        new_id := NULL;
    END LOOP;
    RETURN ids;
END
$$;

CREATE FUNCTION atlantis.enqueue(
    job_name text,
    args jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT NULL,
    queue text DEFAULT NULL,
    delay interval DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (atlantis.enqueue_many(job_name, ARRAY[args], run_at, priority, queue, delay))[1]
$$;
