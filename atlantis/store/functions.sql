-- The live definition of every function of the atlantis schema, trigger functions included.
--
-- `tide db migrate` (atlantis.store.migrate) applies the versioned migrations, then this
-- file, every time, in the same transaction and under the same lock; the definitions here
-- replace the ones the migrations left. Change a function here when its signature stays:
-- the same name, argument types, argument names and return type (bodies, comments,
-- volatility and SET clauses may change; a default may be added). A new function, a new
-- signature or a dropped function is a migration (docs/upgrading.md); migrate refuses this
-- file when it would create a function no migration made, or change one's signature.
--
-- CREATE OR REPLACE keeps a function's owner and grants but resets what the statement does
-- not say: every SECURITY DEFINER function says so here, with its fixed search_path. The
-- roles' rights are granted by atlantis.store.migrate's role step.
--
-- schema.sql beside this file is the whole schema as the migrations and this file leave it,
-- generated: `python -m atlantis.store.schema --write`.


-- ---- Enqueue: declarations, argument checks, unique keys --------------------------------

-- The declaration of `job_name` from atlantis.job_types; raises ATL01 when it is unknown.
CREATE OR REPLACE FUNCTION atlantis.job_type(job_name text) RETURNS atlantis.job_types
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

-- Validate one value against a declared scalar type; returns the reason it does not fit,
-- or NULL when it fits. `timestamptz` and `date` are read strictly (RFC 3339, YYYY-MM-DD);
-- the limits on length and depth are atlantis.limit_mismatch's, checked first.
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

-- Why one value (a field, or an element of an array field) of type `ftype` is past the
-- limits, or NULL. `scan` false says the whole args are too short to hold a number longer
-- than the limit: then only a jsonb container is looked at (for its depth). The limits are
-- atlantis/limits.py's MAX_DEPTH (64) and MAX_NUMBER_CHARS (4000; check_args and
-- fast_checked_args skip the scan of args too short to hold such a number):
-- tests/test_limits.py checks that the database and Python agree.
CREATE OR REPLACE FUNCTION atlantis.limit_mismatch(ftype text, v jsonb, scan boolean) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t text := jsonb_typeof(v);
    longest int;
BEGIN
    IF t = 'number' THEN
        -- In any other type a number is refused as a mismatch, whatever its length.
        IF scan AND ftype IN ('int', 'bigint', 'double', 'numeric', 'jsonb') THEN
            longest := length(v::text);
        END IF;
    ELSIF ftype <> 'jsonb' OR t NOT IN ('object', 'array') THEN
        RETURN NULL;
    ELSE
        -- Deeper than 64 levels <=> some container sits at level 64.
        IF jsonb_path_exists(
            v, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")'
        ) THEN
            RETURN format('nested %s levels deep, more than the limit of 64',
                          atlantis.jsonb_depth(v));
        END IF;
        IF scan THEN
            SELECT max(length(n::text)) INTO longest
              FROM jsonb_path_query(v, 'strict $.** ? (@.type() == "number")') AS n;
        END IF;
    END IF;
    IF longest > 4000 THEN
        RETURN format('a number %s characters long, more than the limit of 4000', longest);
    END IF;
    RETURN NULL;
END
$$;

-- Depth of a jsonb value: 0 for a scalar, 1 + the depth of its deepest member for an
-- array or object (so `[]` is 1 and `{"a": [1]}` is 2).
CREATE OR REPLACE FUNCTION atlantis.jsonb_depth(v jsonb) RETURNS int
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    low int := 0;    -- the depth is at least low
    high int := 64;  -- the depth is less than high, once the search below has run
    mid int;
BEGIN
    -- A container found at level L (the value itself being level 0) means depth >= L + 1.
    -- Double the bound until no container is that deep, then halve the interval.
    LOOP
        EXIT WHEN NOT jsonb_path_exists(v, format(
            'strict $.**{%s} ? (@.type() == "object" || @.type() == "array")', high - 1
        )::jsonpath);
        low := high;
        high := high * 2;
    END LOOP;
    WHILE high - low > 1 LOOP
        mid := (low + high) / 2;
        IF jsonb_path_exists(v, format(
            'strict $.**{%s} ? (@.type() == "object" || @.type() == "array")', mid - 1
        )::jsonpath) THEN
            low := mid;
        ELSE
            high := mid;
        END IF;
    END LOOP;
    RETURN low;
END
$$;

-- Check `args` against the declaration of `decl`; returns the args with defaults filled in.
-- Raises SQLSTATE ATL02 naming the job and the field. The size cap is read from
-- atlantis.settings; the limits on numbers and depth are atlantis.limit_mismatch's.
CREATE OR REPLACE FUNCTION atlantis.check_args(decl atlantis.job_types, args jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f jsonb;
    fname text;
    ftype text;
    flen int;
    v jsonb;
    why text;
    elem jsonb;
    i int;
    out jsonb := '{}';
    -- The cap lives in atlantis.settings (only the schema's owner may change it), no longer
    -- in a GUC that any session could raise with SET.
    limit_bytes int := coalesce(nullif((SELECT s.value FROM atlantis.settings s
                                         WHERE s.name = 'max_args_bytes'), '')::int,
                                1048576);
    args_text text;
    args_bytes int;
    -- Could a number inside a jsonb value be longer than 4000 characters? Not unless the
    -- args are longer than that and hold a run of 255 digits somewhere (such a number has
    -- a run of at least 1999); walking every number costs far more than these two tests.
    long_numbers boolean;
    scan boolean;     -- could this value hold a number longer than the limit?
    limits boolean;   -- does atlantis.limit_mismatch need to look at this value?
    extra text;
BEGIN
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'job %: args must be a JSON object, got %', decl.job,
            coalesce(jsonb_typeof(args), 'nothing') USING ERRCODE = 'ATL02';
    END IF;
    args_text := args::text;
    args_bytes := octet_length(args_text);
    IF args_bytes > limit_bytes THEN
        RAISE EXCEPTION 'job %: args are % bytes, larger than the limit of % bytes', decl.job,
            args_bytes, limit_bytes USING ERRCODE = 'ATL02';
    END IF;
    long_numbers := args_bytes > 4000 AND args_text ~ '[0-9]{255}';
    SELECT k INTO extra FROM jsonb_object_keys(args) AS k
     WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(decl.fields) d WHERE d->>'name' = k)
     ORDER BY k LIMIT 1;
    IF extra IS NOT NULL THEN
        RAISE EXCEPTION 'job %: unknown field %', decl.job, extra USING ERRCODE = 'ATL02';
    END IF;
    FOR f IN SELECT * FROM jsonb_array_elements(decl.fields) LOOP
        fname := f->>'name';
        ftype := f->>'type';
        flen := (f->>'length')::int;
        IF args ? fname THEN
            v := args->fname;
            scan := long_numbers;
        ELSIF (f->>'has_default')::boolean THEN
            v := f->'default';
            scan := true;
        ELSE
            v := 'null';
            scan := false;
        END IF;
        limits := scan OR ftype = 'jsonb';
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
                why := NULL;
                IF limits THEN
                    why := atlantis.limit_mismatch(ftype, elem, scan);
                END IF;
                IF why IS NULL THEN
                    why := atlantis.type_mismatch(ftype, flen, elem);
                END IF;
                IF why IS NOT NULL THEN
                    RAISE EXCEPTION 'job %: field %[%]: %', decl.job, fname, i, why
                        USING ERRCODE = 'ATL02';
                END IF;
                i := i + 1;
            END LOOP;
        ELSE
            why := NULL;
            IF limits THEN
                why := atlantis.limit_mismatch(ftype, v, scan);
            END IF;
            IF why IS NULL THEN
                why := atlantis.type_mismatch(ftype, flen, v);
            END IF;
            IF why IS NOT NULL THEN
                RAISE EXCEPTION 'job %: field %: %', decl.job, fname, why USING ERRCODE = 'ATL02';
            END IF;
        END IF;
        out := out || jsonb_build_object(fname, v);
    END LOOP;
    RETURN out;
END
$$;

-- A set-based check of a whole batch of args (enqueue_many): the same rules as
-- atlantis.check_args, compiled from the declaration into one SQL expression and run over
-- every row of the batch in one statement. Returns the args with defaults filled in, in
-- order, when every row passes; NULL when any row does not (or the declaration has
-- something the fast check does not cover): enqueue_many then checks row by row with
-- atlantis.check_args, which raises the error naming the job and the field. It may refuse
-- rows check_args accepts, never the reverse. The expression is built from the declaration
-- in atlantis.job_types, with every name and value quoted (format %L); types come from a
-- fixed list; nothing a caller passes is ever spliced into it.
CREATE OR REPLACE FUNCTION atlantis.fast_checked_args(decl atlantis.job_types, args_list jsonb[])
RETURNS jsonb[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    f jsonb;
    fname text;
    ftype text;
    flen int;
    v text;
    typed text;
    checks text[] := '{}';
    names text[] := '{}';
    template jsonb := '{}';
    limit_bytes int := coalesce(nullif((SELECT s.value FROM atlantis.settings s
                                         WHERE s.name = 'max_args_bytes'), '')::int,
                                1048576);
    all_ok boolean;
    outs jsonb[];
BEGIN
    FOR f IN SELECT * FROM jsonb_array_elements(decl.fields) LOOP
        fname := f->>'name';
        ftype := f->>'type';
        flen := (f->>'length')::int;
        names := names || fname;
        IF (f->>'has_default')::boolean THEN
            -- A default is checked once here, as check_args would check it (scan on).
            IF (f->>'array')::boolean
               OR atlantis.limit_mismatch(ftype, f->'default', true) IS NOT NULL
               OR atlantis.type_mismatch(ftype, flen, f->'default') IS NOT NULL THEN
                RETURN NULL;
            END IF;
            template := template || jsonb_build_object(fname, f->'default');
        ELSE
            template := template || jsonb_build_object(fname, 'null'::jsonb);
        END IF;
        v := format('(o -> %L)', fname);
        IF (f->>'array')::boolean THEN
            typed := format(
                'CASE WHEN jsonb_typeof(%1$s) = ''array'' THEN NOT EXISTS ('
                'SELECT 1 FROM jsonb_array_elements(%1$s) AS e(v) '
                'WHERE atlantis.type_mismatch(%2$L, %3$s, e.v) IS NOT NULL%4$s) ELSE false END',
                v, ftype, coalesce(flen::text, 'NULL'),
                CASE WHEN ftype = 'jsonb'
                     THEN ' OR atlantis.limit_mismatch(''jsonb'', e.v, false) IS NOT NULL'
                     ELSE '' END);
        ELSE
            typed := CASE ftype
                WHEN 'text' THEN format('jsonb_typeof(%s) = ''string''', v)
                WHEN 'varchar' THEN format(
                    'CASE WHEN jsonb_typeof(%1$s) = ''string'' '
                    'THEN char_length(%1$s #>> ''{}'') <= %2$s ELSE false END', v, flen)
                WHEN 'int' THEN format(
                    'CASE WHEN jsonb_typeof(%1$s) = ''number'' '
                    'THEN (%1$s #>> ''{}'')::numeric = trunc((%1$s #>> ''{}'')::numeric) '
                    'AND (%1$s #>> ''{}'')::numeric BETWEEN -2147483648 AND 2147483647 '
                    'ELSE false END', v)
                WHEN 'bigint' THEN format(
                    'CASE WHEN jsonb_typeof(%1$s) = ''number'' '
                    'THEN (%1$s #>> ''{}'')::numeric = trunc((%1$s #>> ''{}'')::numeric) '
                    'AND (%1$s #>> ''{}'')::numeric '
                    'BETWEEN -9223372036854775808 AND 9223372036854775807 ELSE false END', v)
                WHEN 'double' THEN format(
                    'CASE WHEN jsonb_typeof(%1$s) = ''number'' '
                    'THEN abs((%1$s #>> ''{}'')::numeric) <= 1.7976931348623157e308 '
                    'ELSE false END', v)
                WHEN 'numeric' THEN format('jsonb_typeof(%s) = ''number''', v)
                WHEN 'boolean' THEN format('jsonb_typeof(%s) = ''boolean''', v)
                WHEN 'jsonb' THEN format(
                    'atlantis.limit_mismatch(''jsonb'', %s, false) IS NULL', v)
                WHEN 'uuid' THEN format('atlantis.type_mismatch(''uuid'', NULL, %s) IS NULL', v)
                WHEN 'timestamptz' THEN format(
                    'atlantis.type_mismatch(''timestamptz'', NULL, %s) IS NULL', v)
                WHEN 'date' THEN format('atlantis.type_mismatch(''date'', NULL, %s) IS NULL', v)
                END;
            IF typed IS NULL THEN
                RETURN NULL;  -- a type this check does not know: check_args decides
            END IF;
        END IF;
        checks := checks || format('CASE WHEN jsonb_typeof(%s) = ''null'' THEN %s ELSE %s END',
                                   v, CASE WHEN coalesce((f->>'not_null')::boolean, false)
                                           THEN 'false' ELSE 'true' END, typed);
    END LOOP;
    EXECUTE format(
        'SELECT bool_and(coalesce(ok, false)), array_agg(o ORDER BY ord) '
        '  FROM (SELECT ord, o, '
        '               CASE WHEN jsonb_typeof(x) = ''object'' '
        '                    THEN octet_length(xt) <= %s '
        '                         AND (octet_length(xt) <= 4000 OR xt !~ ''[0-9]{255}'') '
        '                         AND (x - %L::text[]) = ''{}''::jsonb '
        '                         AND %s '
        '                    ELSE false END AS ok '
        '          FROM (SELECT u.x, u.ord, u.x::text AS xt, %L::jsonb || u.x AS o '
        '                  FROM unnest($1) WITH ORDINALITY AS u(x, ord)) r) s',
        limit_bytes, names,
        CASE WHEN cardinality(checks) = 0 THEN 'true' ELSE array_to_string(checks, ' AND ') END,
        template)
    INTO all_ok, outs USING args_list;
    IF all_ok THEN
        RETURN outs;
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION atlantis.fast_checked_args(atlantis.job_types, jsonb[]) FROM PUBLIC;

-- A double as the float it reads as, written in the fewest digits that read back as the
-- same float (0.30000000000000004 stays apart from 0.3), whatever extra_float_digits the
-- session has. Below the smallest normal double, the number itself (float8 would refuse it).
CREATE OR REPLACE FUNCTION atlantis.canonical_double(n numeric) RETURNS jsonb
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
REVOKE ALL ON FUNCTION atlantis.canonical_double(numeric) FROM PUBLIC;

-- One value of a field (an array field's whole array when `is_array`) as its declared type
-- reads it, as JSON: the part of a unique key that stands for it. A value the type does not
-- read (left from before version 12) is returned as it is; this function never raises.
CREATE OR REPLACE FUNCTION atlantis.canonical_value(ftype text, is_array boolean, v jsonb) RETURNS jsonb
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
REVOKE ALL ON FUNCTION atlantis.canonical_value(text, boolean, jsonb) FROM PUBLIC;

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

-- Enqueue one job: atlantis.enqueue_many of one row.
CREATE OR REPLACE FUNCTION atlantis.enqueue(
    job_name text,
    args jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT NULL,
    priority int DEFAULT NULL,
    queue text DEFAULT NULL,
    delay interval DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
    SELECT (atlantis.enqueue_many(job_name, ARRAY[args], run_at, priority, queue, delay))[1]
$$;


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

-- Clamp a checkpoint's percentage: NaN counts as 0, infinities and out-of-range values
-- are pulled into 0..100.
CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p double precision) RETURNS smallint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p IS NULL OR p = 'NaN'::float8 THEN 0
                ELSE round(least(greatest(p, 0), 100))::smallint END
$$;

-- Delay before attempt `attempt + 1`: base * 2^(attempt-1), jittered by +-25%, capped at a day.
CREATE OR REPLACE FUNCTION atlantis.retry_delay(base interval, attempt int) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT least(base * power(2, greatest(attempt - 1, 0))::float8 * (0.75 + random() * 0.5),
                 interval '1 day')
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


-- ---- Operators: stalls, cancel, retry, pause, resume, delete, prune ---------------------

-- The stall threshold of a job: its declaration's `stall`, else 3 x its heartbeat.
CREATE OR REPLACE FUNCTION atlantis.stall_after(job_name text, heartbeat interval) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT t.stall FROM atlantis.job_types t WHERE t.job = job_name),
                    heartbeat * 3)
$$;

-- Whether a running job has gone without a checkpoint (or, before its first one, since its
-- claim) for longer than its stall threshold.
CREATE OR REPLACE FUNCTION atlantis.stalled(j atlantis.jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.state = 'running'
       AND now() - coalesce(j.progress_at, j.started_at) > atlantis.stall_after(j.job, j.heartbeat)
$$;

-- Cancel a job. A waiting one is `cancelled` at once (its `errors` entry names the run); a
-- running one is flagged, and its supervisor (told on channel atlantis_control) tells the
-- handler, then stops it after its grace; the job ends `cancelled` whatever the attempt does
-- meanwhile. Returns the state the job is in afterwards ('cancelled' or 'running'), NULL
-- when it had finished already. `by` records who acted: the caller's role unless the caller
-- names someone; its default is evaluated by the caller, so it stays the caller's role
-- under SECURITY DEFINER.
CREATE OR REPLACE FUNCTION atlantis.cancel(job_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    j atlantis.jobs;
    who text := coalesce(cancel.by, current_user);
    message text;
BEGIN
    SELECT * INTO j FROM atlantis.jobs WHERE id = cancel.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', cancel.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.state = 'available' THEN
        message := format('cancelled by %s', who);
        UPDATE atlantis.jobs
           SET state = 'cancelled', finished_at = now(), cancelled_by = who,
               last_error = message, error_count = error_count + 1,
               errors = atlantis.errors_append(errors, jsonb_build_object(
                   'run', j.run, 'attempt', j.attempt, 'kind', 'cancelled',
                   'message', message, 'at', now(), 'by', who))
         WHERE id = j.id;
        RETURN 'cancelled';
    END IF;
    IF j.state = 'running' THEN
        IF j.cancel_requested_at IS NULL THEN
            UPDATE atlantis.jobs SET cancel_requested_at = now(), cancelled_by = who
             WHERE id = j.id;
        END IF;
        -- Again on a repeated cancel: harmless, and it reaches a supervisor that missed one.
        PERFORM pg_notify('atlantis_control', json_build_object(
            'op', 'cancel', 'job_id', j.id, 'worker', j.claimed_by)::text);
        RETURN 'running';
    END IF;
    RETURN NULL;
END
$$;

-- Put a `dead` or `cancelled` job back to `available` with a fresh attempt budget, now.
-- Progress and the last error are cleared; `errors` and `error_count` are kept as history.
-- The unique key is recomputed from the job's args under its current declaration (kept as
-- it was when the job type is no longer declared); a key another waiting or running job
-- holds is refused (ATL03, naming that job). Wakes the queue's supervisors. Returns the id,
-- or NULL when the job is in another state.
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

-- Stop supervisors claiming from `queue` (running attempts continue). Returns whether the
-- queue was being served until now.
CREATE OR REPLACE FUNCTION atlantis.pause(queue text, reason text DEFAULT NULL,
                               by text DEFAULT current_user) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    SELECT q.paused INTO was FROM atlantis.queues q WHERE q.name = pause.queue FOR UPDATE;
    INSERT INTO atlantis.queues AS q (name, paused, reason, changed_by, changed_at)
    VALUES (pause.queue, true, pause.reason, coalesce(pause.by, current_user), now())
    ON CONFLICT (name) DO UPDATE
       SET paused = true, reason = excluded.reason, changed_by = excluded.changed_by,
           changed_at = excluded.changed_at;
    PERFORM pg_notify('atlantis_control', json_build_object('op', 'pause', 'queue', pause.queue)::text);
    RETURN NOT coalesce(was, false);
END
$$;

-- Let supervisors claim from `queue` again. Returns whether it was paused until now.
CREATE OR REPLACE FUNCTION atlantis.resume(queue text, by text DEFAULT current_user) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    SELECT q.paused INTO was FROM atlantis.queues q WHERE q.name = resume.queue FOR UPDATE;
    INSERT INTO atlantis.queues AS q (name, paused, reason, changed_by, changed_at)
    VALUES (resume.queue, false, NULL, coalesce(resume.by, current_user), now())
    ON CONFLICT (name) DO UPDATE
       SET paused = false, reason = NULL, changed_by = excluded.changed_by,
           changed_at = excluded.changed_at;
    PERFORM pg_notify('atlantis_control', json_build_object('op', 'resume', 'queue', resume.queue)::text);
    -- Work may have piled up meanwhile: wake the queue's supervisors too.
    PERFORM pg_notify('atlantis_jobs', resume.queue);
    RETURN coalesce(was, false);
END
$$;

-- Delete finished jobs by id, with their attempts and logs (the console's delete, for a role
-- without table rights); returns how many jobs went. Waiting and running jobs are never
-- deleted.
CREATE OR REPLACE FUNCTION atlantis.delete_finished(ids bigint[]) RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    deleted int;
BEGIN
    WITH gone AS (
        DELETE FROM atlantis.jobs j
         WHERE j.id = ANY (delete_finished.ids) AND j.state IN ('complete', 'dead', 'cancelled')
        RETURNING j.id
    ), attempts AS (
        DELETE FROM atlantis.attempts a USING gone WHERE a.job_id = gone.id
    ), logs AS (
        DELETE FROM atlantis.logs l USING gone WHERE l.job_id = gone.id
    )
    SELECT count(*)::int INTO deleted FROM gone;
    RETURN deleted;
END
$$;

-- Delete at most `batch` finished jobs in `states` (complete, cancelled, dead) that finished
-- more than `older_than` ago, oldest first, with their attempts and logs; returns how many
-- jobs were deleted. Waiting and running jobs are never deleted. One batch per call, so
-- that each runs in a short transaction: callers repeat while it returns `batch`. Rows
-- locked by someone else (a prune running beside this one) are skipped, not waited for.
CREATE OR REPLACE FUNCTION atlantis.prune(older_than interval,
                               states text[] DEFAULT ARRAY['complete', 'cancelled', 'dead'],
                               batch int DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    bad text;
    deleted bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'prune: the age must be 0 or more, not %', coalesce(older_than::text, 'null')
            USING ERRCODE = '22023';
    END IF;
    SELECT s INTO bad FROM unnest(coalesce(states, '{}')) AS s
     WHERE s IS NULL OR s NOT IN ('complete', 'cancelled', 'dead') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'prune: only complete, cancelled and dead jobs can be pruned, not %',
            coalesce(bad, 'null') USING ERRCODE = '22023';
    END IF;
    WITH doomed AS (
        SELECT j.id FROM atlantis.jobs j
         WHERE j.finished_at IS NOT NULL
           AND j.finished_at < now() - older_than
           AND j.state = ANY (states)
           AND j.state IN ('complete', 'cancelled', 'dead')
         ORDER BY j.finished_at
         LIMIT greatest(coalesce(batch, 1000), 1)
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM atlantis.jobs j USING doomed WHERE j.id = doomed.id RETURNING j.id
    ), attempts AS (
        DELETE FROM atlantis.attempts a WHERE a.job_id IN (SELECT id FROM gone)
    ), logs AS (
        DELETE FROM atlantis.logs l WHERE l.job_id IN (SELECT id FROM gone)
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;


-- ---- Schedules --------------------------------------------------------------------------

-- One slot of a schedule (the previous releases' supervisors call it; the current one calls
-- atlantis.schedule_catch_up), under the same lock as schedule_catch_up: a slot at or before
-- the latest one recorded is 'taken' (it may lie inside a run of missed slots), a slot past
-- `grace` is 'missed' (a row of one; 'skipped' for a schedule that never ran), else the job
-- is 'enqueued' with its default args and its id returned.
CREATE OR REPLACE FUNCTION atlantis.schedule_fire(job_name text, slot timestamptz,
                                                  grace interval,
                                                  OUT outcome text, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    latest timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('atlantis.schedule_runs'), hashtext(job_name));
    SELECT max(r.slot) INTO latest FROM atlantis.schedule_runs r WHERE r.job = job_name;
    IF schedule_fire.slot < now() - grace AND latest IS NULL THEN
        outcome := 'skipped';
        RETURN;
    END IF;
    IF schedule_fire.slot <= latest THEN
        outcome := 'taken';
        RETURN;
    END IF;
    IF schedule_fire.slot < now() - grace THEN
        INSERT INTO atlantis.schedule_runs AS r (job, slot, missed, missed_from)
        VALUES (job_name, schedule_fire.slot, 1, schedule_fire.slot);
        outcome := 'missed';
        RETURN;
    END IF;
    job_id := atlantis.enqueue(job_name, '{}');
    INSERT INTO atlantis.schedule_runs AS r (job, slot, job_id)
    VALUES (job_name, schedule_fire.slot, schedule_fire.job_id);
    outcome := 'enqueued';
END
$$;

-- Every slot of one schedule since the latest one recorded, in one transaction. The caller
-- (the supervisors' scheduler, which does the cron arithmetic) read `after`, the latest slot
-- recorded for the job (NULL if none), and passes what follows it up to the database's clock:
-- `missed` slots from `missed_from` to `missed_to`, past the grace, and `due`, the slots
-- within the grace, in order. One caller per schedule at a time (an advisory lock on the
-- job's name, not waited for: while another holds it, `outcome` is 'busy' and nothing is
-- done, so that a supervisor stopped inside this function holds up no other); if the latest
-- slot recorded is no longer `after` (another supervisor was
-- first, or an older one fired a slot with atlantis.schedule_fire), nothing is done and
-- `outcome` is 'stale' with that slot in `last_slot`: the caller computes again from it.
-- Else the missed slots become one row (none when the schedule never ran: a new schedule
-- does not count its past as missed), each due slot a row and a job with the default args,
-- and `outcome` is 'done', with `last_slot` the latest slot now recorded and `job_ids` the
-- new jobs in the order of `due`.
CREATE OR REPLACE FUNCTION atlantis.schedule_catch_up(job_name text, after timestamptz,
                                           missed_from timestamptz, missed_to timestamptz,
                                           missed bigint, due timestamptz[],
                                           OUT outcome text, OUT last_slot timestamptz,
                                           OUT job_ids bigint[])
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    latest timestamptz;
    s timestamptz;
    new_id bigint;
BEGIN
    job_ids := '{}';
    IF NOT pg_try_advisory_xact_lock(hashtext('atlantis.schedule_runs'), hashtext(job_name)) THEN
        outcome := 'busy';
        RETURN;
    END IF;
    SELECT max(r.slot) INTO latest FROM atlantis.schedule_runs r WHERE r.job = job_name;
    IF latest IS DISTINCT FROM after THEN
        outcome := 'stale';
        last_slot := latest;
        RETURN;
    END IF;
    IF latest IS NOT NULL AND coalesce(schedule_catch_up.missed, 0) > 0
       AND missed_to > latest THEN
        INSERT INTO atlantis.schedule_runs AS r (job, slot, missed, missed_from)
        VALUES (job_name, missed_to, schedule_catch_up.missed,
                coalesce(schedule_catch_up.missed_from, missed_to));
        latest := missed_to;
    END IF;
    FOREACH s IN ARRAY coalesce(due, '{}') LOOP
        CONTINUE WHEN latest IS NOT NULL AND s <= latest;
        new_id := atlantis.enqueue(job_name, '{}');
        INSERT INTO atlantis.schedule_runs (job, slot, job_id) VALUES (job_name, s, new_id);
        job_ids := job_ids || new_id;
        latest := s;
    END LOOP;
    outcome := 'done';
    last_slot := latest;
END
$$;
REVOKE ALL ON FUNCTION
    atlantis.schedule_catch_up(text, timestamptz, timestamptz, timestamptz, bigint,
                               timestamptz[])
    FROM PUBLIC;

-- Forget slots recorded more than `older_than` ago, keeping each schedule's latest (what
-- `tide schedule list` shows as its last run, and proof that it ran before). Returns how
-- many rows went.
CREATE OR REPLACE FUNCTION atlantis.prune_schedule_runs(older_than interval, batch int DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH doomed AS (
        SELECT r.job, r.slot FROM atlantis.schedule_runs r
         WHERE r.created_at < now() - older_than
           AND r.slot < (SELECT max(l.slot) FROM atlantis.schedule_runs l WHERE l.job = r.job)
         ORDER BY r.created_at
         LIMIT greatest(coalesce(batch, 1000), 1)
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM atlantis.schedule_runs r USING doomed
         WHERE r.job = doomed.job AND r.slot = doomed.slot
        RETURNING 1
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;


-- ---- Counts for tide and the console ----------------------------------------------------

-- Counts by queue and state that stay cheap on a table of millions of rows (the overview of
-- `tide console` and `tide queue stats`): for each state, the queues that have rows in it
-- (a loose index scan of jobs_state_queue_idx), and for each such pair at most cap + 1 rows
-- counted. Up to `cap` the count is exact; beyond it the planner's estimate is returned
-- (EXPLAIN of the same filter) with exact = false, never below cap + 1. `due` is a
-- pseudo-state: available with run_at <= now().
CREATE OR REPLACE FUNCTION atlantis.queue_counts(cap bigint DEFAULT 10000)
RETURNS TABLE (queue text, state text, n bigint, exact boolean)
LANGUAGE plpgsql VOLATILE  -- EXPLAIN is not allowed in a stable function
SET search_path = pg_catalog, atlantis
AS $$
#variable_conflict use_column
DECLARE
    s text;
    q text;
    plan jsonb;
BEGIN
    FOREACH s IN ARRAY ARRAY['available', 'running', 'complete', 'dead', 'cancelled'] LOOP
        SELECT j.queue INTO q FROM atlantis.jobs j WHERE j.state = s ORDER BY j.queue LIMIT 1;
        WHILE q IS NOT NULL LOOP
            queue := q;
            state := s;
            SELECT count(*) INTO n
              FROM (SELECT 1 FROM atlantis.jobs j
                     WHERE j.state = s AND j.queue = q LIMIT cap + 1) capped;
            exact := n <= cap;
            IF NOT exact THEN
                EXECUTE format('EXPLAIN (FORMAT JSON) SELECT 1 FROM atlantis.jobs'
                               ' WHERE state = %L AND queue = %L', s, q) INTO plan;
                n := greatest(cap + 1, (plan->0->'Plan'->>'Plan Rows')::numeric::bigint);
            END IF;
            RETURN NEXT;
            IF s = 'available' THEN
                state := 'due';
                SELECT count(*) INTO n
                  FROM (SELECT 1 FROM atlantis.jobs j
                         WHERE j.state = 'available' AND j.queue = q AND j.run_at <= now()
                         LIMIT cap + 1) capped;
                exact := n <= cap;
                RETURN NEXT;
            END IF;
            SELECT j.queue INTO q FROM atlantis.jobs j
             WHERE j.state = s AND j.queue > q ORDER BY j.queue LIMIT 1;
        END LOOP;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION atlantis.queue_counts(bigint) FROM PUBLIC;

-- The run_at of the queue's oldest due job, by one index probe per distinct priority in
-- jobs_fetch_idx (queue, priority, run_at, id).
CREATE OR REPLACE FUNCTION atlantis.oldest_due(q text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, atlantis
AS $$
DECLARE
    p int;
    first timestamptz;
    oldest timestamptz;
BEGIN
    SELECT j.priority INTO p FROM atlantis.jobs j
     WHERE j.state = 'available' AND j.queue = q ORDER BY j.priority LIMIT 1;
    WHILE p IS NOT NULL LOOP
        SELECT j.run_at INTO first FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.queue = q AND j.priority = p
         ORDER BY j.run_at LIMIT 1;
        IF first <= now() AND (oldest IS NULL OR first < oldest) THEN
            oldest := first;
        END IF;
        SELECT j.priority INTO p FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.queue = q AND j.priority > p
         ORDER BY j.priority LIMIT 1;
    END LOOP;
    RETURN oldest;
END
$$;
REVOKE ALL ON FUNCTION atlantis.oldest_due(text) FROM PUBLIC;
