-- ---- Enqueue: keys and the enqueue statements -------------------------------------------

-- The digest of a key derived from args (a unique key, a limit's group or key): what every
-- index over such a key holds (migration 0021). A key may be as long as the args (1 MiB); a
-- btree entry holds at most 2,704 bytes. SHA-256, so that two keys never share a digest,
-- as hex text. IMMUTABLE for the indexes (the database's encoding never changes): its body
-- changes only with a migration that rebuilds jobs_unique_idx, workflow_instances_unique_idx
-- and the rows' limit_group and limit_starts.key.
CREATE OR REPLACE FUNCTION atlantis.key_digest(key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT encode(sha256(convert_to(key, 'UTF8')), 'hex') $$;
REVOKE ALL ON FUNCTION atlantis.key_digest(text) FROM PUBLIC;

-- A key (or a value of one) as a message or a label shows it: its first 200 characters,
-- then how long it is. The key itself is kept whole (the args hold it).
CREATE OR REPLACE FUNCTION atlantis.key_text(key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT CASE WHEN length(key) <= 200 THEN key
                  ELSE left(key, 200) || format('... (%s characters)', length(key)) END $$;
REVOKE ALL ON FUNCTION atlantis.key_text(text) FROM PUBLIC;

-- The unique key of `args` (already checked) under `decl`: a JSON array of the canonical
-- values of its unique fields, in the order of `unique (...)`, as text; NULL when `decl`
-- declares none. A plain function (tide db doctor's reader role may execute it and the
-- three it calls): SECURITY DEFINER would double the cost of a unique enqueue.
CREATE OR REPLACE FUNCTION atlantis.unique_key(decl atlantis.job_types, args jsonb) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF cardinality(decl.unique_fields) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT jsonb_agg(atlantis.canonical_value(
                                 d->>'type', coalesce((d->>'array')::boolean, false),
                                 args->(d->>'name'))
                             ORDER BY array_position(decl.unique_fields, d->>'name'))::text
              FROM jsonb_array_elements(decl.fields) AS d
             WHERE d->>'name' = ANY (decl.unique_fields));
END
$$;
REVOKE ALL ON FUNCTION atlantis.unique_key(atlantis.job_types, jsonb) FROM PUBLIC;

-- One row of a unique job (enqueue_many's, `a` checked): inserted, or, when a waiting or
-- running row holds its unique key, that row; returns the row's id. The insert and the look
-- up repeat until one wins (the holder may end between them).
CREATE OR REPLACE FUNCTION atlantis.enqueue_unique(decl atlantis.job_types, a jsonb, q text,
                                                   prio int, start_at timestamptz,
                                                   limited boolean, trace_context jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    key text := atlantis.unique_key(decl, a);
    new_id bigint;
BEGIN
    LOOP
        INSERT INTO atlantis.jobs (job, queue, args, max_attempts, priority, run_at, timeout,
                                   heartbeat, backoff, unique_key, limit_group, trace_context)
        VALUES (decl.job, q, a, decl.max_attempts, prio, start_at, decl.timeout,
                decl.heartbeat, decl.backoff, key,
                CASE WHEN limited THEN atlantis.limit_group(decl, a, true) END,
                enqueue_unique.trace_context)
        ON CONFLICT (job, atlantis.key_digest(unique_key))
            WHERE unique_key IS NOT NULL AND state IN ('available', 'running')
            DO NOTHING
        RETURNING id INTO new_id;
        IF new_id IS NULL THEN
            SELECT j.id INTO new_id FROM atlantis.jobs j
             WHERE j.job = decl.job AND j.unique_key IS NOT NULL
               AND atlantis.key_digest(j.unique_key) = atlantis.key_digest(key)
               AND j.state IN ('available', 'running');
        END IF;
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION atlantis.enqueue_unique(atlantis.job_types, jsonb, text, int,
                                               timestamptz, boolean, jsonb) FROM PUBLIC;

-- Enqueue a batch of one job; returns the ids in the order of `args_list`. A batch of 8 or
-- more rows is checked set-based first (atlantis.fast_checked_args). A job declared
-- `unique (...)` returns the existing id for a key (atlantis.unique_key) already available
-- or running. A negative delay is refused (ATL02).
CREATE OR REPLACE FUNCTION atlantis.enqueue_many(
    job_name text,
    args_list jsonb[],
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT NULL,
    queue text DEFAULT NULL,
    delay interval DEFAULT NULL,
    trace_context jsonb DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    decl atlantis.job_types := atlantis.job_type(job_name);
    start_at timestamptz;
    ids bigint[];
    checked jsonb[];
    a jsonb;
    i int := 0;
    -- Rows of a limited job, or on a limited queue, are marked (jobs.limit_group).
    limited boolean := jsonb_array_length(decl.limits) > 0 OR EXISTS (
        SELECT 1 FROM atlantis.queues q
         WHERE q.name = coalesce(enqueue_many.queue, decl.queue) AND q.concurrency IS NOT NULL);
BEGIN
    IF delay < interval '0' THEN
        RAISE EXCEPTION 'job %: delay must be 0 or more, not %', decl.job, delay
            USING ERRCODE = 'ATL02';
    END IF;
    start_at := coalesce(run_at, now() + coalesce(delay, interval '0'));
    IF cardinality(args_list) >= 8 THEN
        checked := atlantis.fast_checked_args(decl, args_list);
    END IF;
    IF cardinality(decl.unique_fields) = 0 THEN
        WITH input AS (
            SELECT nextval('atlantis.jobs_id_seq') AS id,
                   coalesce(u.c, atlantis.check_args(decl, u.x)) AS args, u.ord
              FROM unnest(args_list, checked) WITH ORDINALITY AS u(x, c, ord)
        ), ins AS (
            INSERT INTO atlantis.jobs (id, job, queue, args, max_attempts, priority, run_at,
                                       timeout, heartbeat, backoff, limit_group, trace_context)
            SELECT input.id, decl.job, coalesce(enqueue_many.queue, decl.queue), input.args,
                   decl.max_attempts, coalesce(enqueue_many.priority, decl.priority), start_at,
                   decl.timeout, decl.heartbeat, decl.backoff,
                   CASE WHEN limited THEN atlantis.limit_group(decl, input.args, true) END,
                   enqueue_many.trace_context
              FROM input
        )
        -- A data-modifying CTE always runs; `input` is computed once for both uses.
        SELECT array_agg(input.id ORDER BY input.ord) INTO ids FROM input;
        RETURN coalesce(ids, '{}');
    END IF;
    ids := '{}';
    FOREACH a IN ARRAY args_list LOOP
        i := i + 1;
        a := coalesce(checked[i], atlantis.check_args(decl, a));
        ids := ids || atlantis.enqueue_unique(
            decl, a, coalesce(enqueue_many.queue, decl.queue),
            coalesce(enqueue_many.priority, decl.priority), start_at, limited,
            enqueue_many.trace_context);
    END LOOP;
    RETURN ids;
END
$$;

-- Enqueue one job: atlantis.enqueue_many of one row.
CREATE OR REPLACE FUNCTION atlantis.enqueue(
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
AS $$
    SELECT (atlantis.enqueue_many(job_name, ARRAY[args], run_at, priority, queue, delay,
                                  trace_context))[1]
$$;
