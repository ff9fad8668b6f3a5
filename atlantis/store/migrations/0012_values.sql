-- atlantis schema, version 12: arguments read as their declared type, and unique keys built
-- from the values, not from their JSON spelling.
--
-- * `timestamptz` takes RFC 3339 only: YYYY-MM-DD, `T` or a space, HH:MM:SS, an optional
--   fraction, and `Z` or an offset (+HH:MM, +HHMM or +HH). A value without an offset is
--   refused with a message that says so (it was read in the server's time zone), and
--   PostgreSQL's special words (now, today, tomorrow, infinity, epoch, Julian days, BC) are
--   refused. `date` takes YYYY-MM-DD only. atlantis.declarations.formats holds the same
--   rules for Python (the `.atl` checker's defaults); tests/test_unique_values.py checks
--   that both sides agree.
-- * A `unique (...)` key is built by atlantis.unique_key from each field's value as its
--   type reads it: a number without trailing zeros (a double as the float it reads as), a
--   uuid in its lower-case hyphenated form, an instant in UTC, a date as YYYY-MM-DD, array
--   elements alike. Values already in canonical form give the same key as before.
-- * enqueue_many refuses a negative delay (ATL02).
-- * atlantis.retry recomputes the key from the current declaration.
-- * Waiting and running rows are re-keyed where the new key conflicts with no other row;
--   duplicates that already exist keep their keys, and `tide db doctor` lists them.

-- Validate one value against a declared scalar type; returns the reason it does not fit,
-- or NULL when it fits. Version 3 with timestamptz and date read strictly.
CREATE OR REPLACE FUNCTION atlantis.type_mismatch(ftype text, flen int, v jsonb) RETURNS text
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
    WHEN 'double' THEN
        IF t <> 'number' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
        n := (v #>> '{}')::numeric;
        IF abs(n) > 1.7976931348623157e308 THEN
            s := v::text;
            RETURN format('%s is out of range for double',
                          CASE WHEN length(s) > 40 THEN left(s, 37) || '...' ELSE s END);
        END IF;
    WHEN 'numeric' THEN
        IF t <> 'number' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
    WHEN 'boolean' THEN
        IF t <> 'boolean' THEN RETURN format('expected boolean, got %s', t); END IF;
    WHEN 'uuid' THEN
        IF t <> 'string' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
        IF NOT pg_input_is_valid(v #>> '{}', 'uuid') THEN
            RETURN format('%s is not a valid uuid', left(v::text, 80));
        END IF;
    WHEN 'timestamptz' THEN
        IF t <> 'string' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
        s := v #>> '{}';
        -- The patterns are atlantis.declarations.formats' (TIMESTAMPTZ, NO_OFFSET).
        ok := s ~ ('^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]'
                   '(\.[0-9]+)?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$')
              AND pg_input_is_valid(s, 'timestamptz');
        IF NOT ok THEN
            IF s ~ ('^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?$') THEN
                RETURN format('%s has no time zone offset: a timestamptz needs Z or an offset '
                              'such as +02:00 (RFC 3339)', left(v::text, 80));
            END IF;
            RETURN format('%s is not a valid timestamptz: expected RFC 3339 with Z or an '
                          'offset, such as "2024-01-31T12:00:00Z"', left(v::text, 80));
        END IF;
    WHEN 'date' THEN
        IF t <> 'string' THEN RETURN format('expected %s, got %s', ftype, t); END IF;
        s := v #>> '{}';
        IF NOT (s ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' AND pg_input_is_valid(s, 'date')) THEN
            RETURN format('%s is not a valid date: expected YYYY-MM-DD, such as "2024-01-31"',
                          left(v::text, 80));
        END IF;
    WHEN 'jsonb' THEN
        RETURN NULL;
    ELSE
        RETURN format('unknown type %s', ftype);
    END CASE;
    RETURN NULL;
END
$$;

-- A double as the float it reads as, written in the fewest digits that read back as the
-- same float (0.30000000000000004 stays apart from 0.3), whatever extra_float_digits the
-- session has. Below the smallest normal double, the number itself (float8 would refuse it).
CREATE FUNCTION atlantis.canonical_double(n numeric) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET extra_float_digits = 1
AS $$
BEGIN
    IF n = 0 OR abs(n) >= 1e-307 THEN
        RETURN to_jsonb(((n::float8)::text)::numeric);
    END IF;
    RETURN to_jsonb(trim_scale(n));
END
$$;

-- One value of a field (an array field's whole array when `is_array`) as its declared type
-- reads it, as JSON: the part of a unique key that stands for it. A value the type does not
-- read (left from before version 12) is returned as it is; this function never raises.
CREATE FUNCTION atlantis.canonical_value(ftype text, is_array boolean, v jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text := jsonb_typeof(v);
    s text;
BEGIN
    IF v IS NULL THEN
        RETURN 'null'::jsonb;
    END IF;
    IF t = 'null' OR ftype IN ('text', 'varchar', 'boolean', 'jsonb') THEN
        RETURN v;  -- as written (jsonb already orders keys and drops whitespace)
    END IF;
    IF is_array THEN
        IF t <> 'array' THEN
            RETURN v;
        END IF;
        RETURN (SELECT coalesce(jsonb_agg(atlantis.canonical_value(ftype, false, e.x)
                                          ORDER BY e.i), '[]'::jsonb)
                  FROM jsonb_array_elements(v) WITH ORDINALITY AS e(x, i));
    END IF;
    IF t = 'number' AND ftype IN ('int', 'bigint', 'numeric') THEN
        -- 1, 1.0, 1.00 and 1e0 are one number; -0 is 0.
        RETURN to_jsonb(trim_scale((v #>> '{}')::numeric));
    ELSIF t = 'number' AND ftype = 'double' THEN
        RETURN atlantis.canonical_double((v #>> '{}')::numeric);
    ELSIF t = 'string' AND ftype IN ('uuid', 'timestamptz', 'date')
          AND atlantis.type_mismatch(ftype, NULL, v) IS NULL THEN
        s := v #>> '{}';
        RETURN to_jsonb(CASE ftype
            WHEN 'uuid' THEN s::uuid::text
            WHEN 'timestamptz' THEN to_char(s::timestamptz AT TIME ZONE 'UTC',
                                            'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            ELSE to_char(s::date, 'YYYY-MM-DD') END);
    END IF;
    RETURN v;
END
$$;

-- The unique key of `args` (already checked) under `decl`: a JSON array of the canonical
-- values of its unique fields, in the order of `unique (...)`, as text; NULL when `decl`
-- declares none. A plain function (tide db doctor's reader role may execute it and the
-- three it calls): SECURITY DEFINER would double the cost of a unique enqueue.
CREATE FUNCTION atlantis.unique_key(decl atlantis.job_types, args jsonb) RETURNS text
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

-- enqueue_many as in 0011, with the key from atlantis.unique_key and a negative delay
-- refused.
CREATE OR REPLACE FUNCTION atlantis.enqueue_many(
    job_name text,
    args_list jsonb[],
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT NULL,
    queue text DEFAULT NULL,
    delay interval DEFAULT NULL
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
    key text;
    new_id bigint;
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
        i := i + 1;
        a := coalesce(checked[i], atlantis.check_args(decl, a));
        key := atlantis.unique_key(decl, a);
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

-- retry as in 0005 (SECURITY DEFINER as in 0008), with one change, marked below: the
-- unique key is recomputed from the job's args under its current declaration (kept as it
-- was when the job type is no longer declared).
CREATE OR REPLACE FUNCTION atlantis.retry(job_id bigint, by text DEFAULT current_user)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    j atlantis.jobs;
    who text := coalesce(retry.by, current_user);
    holder atlantis.jobs;
    decl atlantis.job_types;  -- version 12
BEGIN
    SELECT * INTO j FROM atlantis.jobs WHERE id = retry.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', retry.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.state NOT IN ('dead', 'cancelled') THEN
        RETURN NULL;
    END IF;
    -- Version 12: the key as atlantis.unique_key builds it today.
    SELECT * INTO decl FROM atlantis.job_types t WHERE t.job = j.job;
    IF FOUND THEN
        j.unique_key := atlantis.unique_key(decl, j.args);
    END IF;
    BEGIN
        UPDATE atlantis.jobs
           SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
               claimed_by = NULL, claimed_until = NULL, cancel_requested_at = NULL,
               cancelled_by = NULL, progress_pct = NULL, progress_msg = NULL,
               progress_at = NULL, progress_history = '[]', last_error = NULL,
               retried_by = who, retried_at = now(),
               unique_key = j.unique_key  -- version 12
         WHERE id = j.id;
    EXCEPTION WHEN unique_violation THEN
        -- jobs_unique_idx: another job of this name holds the key, waiting or running.
        SELECT * INTO holder FROM atlantis.jobs h
         WHERE h.job = j.job AND h.unique_key = j.unique_key
           AND h.state IN ('available', 'running') AND h.id <> j.id
         LIMIT 1;
        RAISE EXCEPTION 'job % (%) already holds the unique key %; retry job % once it has finished',
            coalesce(holder.id::text, '?'), j.job, j.unique_key, j.id
            USING ERRCODE = 'ATL03';
    END;
    PERFORM pg_notify('atlantis_jobs', j.queue);
    RETURN j.id;
END
$$;

-- Re-key the waiting and running rows whose key changes, where no other waiting or running
-- row of the job would hold the same new key; the rest keep their keys (tide db doctor's
-- duplicate_unique_keys lists them).
WITH keyed AS (
    SELECT j.id, j.job, j.unique_key AS old_key, atlantis.unique_key(t, j.args) AS new_key
      FROM atlantis.jobs j
      JOIN atlantis.job_types t ON t.job = j.job
     WHERE j.state IN ('available', 'running') AND j.unique_key IS NOT NULL
), counted AS (
    SELECT k.*, count(*) OVER (PARTITION BY k.job, k.new_key) AS holders
      FROM keyed k
)
UPDATE atlantis.jobs j
   SET unique_key = c.new_key
  FROM counted c
 WHERE j.id = c.id AND c.holders = 1 AND c.new_key IS NOT NULL
   AND c.new_key IS DISTINCT FROM c.old_key
   AND NOT EXISTS (SELECT 1 FROM atlantis.jobs o
                    WHERE o.job = c.job AND o.unique_key = c.new_key AND o.id <> c.id
                      AND o.state IN ('available', 'running'));

REVOKE ALL ON FUNCTION atlantis.canonical_double(numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION atlantis.canonical_value(text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION atlantis.unique_key(atlantis.job_types, jsonb) FROM PUBLIC;
