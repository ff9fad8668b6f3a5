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
    key text;
    new_id bigint;
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
        key := atlantis.unique_key(decl, a);
        LOOP
            INSERT INTO atlantis.jobs (job, queue, args, max_attempts, priority, run_at,
                                       timeout, heartbeat, backoff, unique_key, limit_group,
                                       trace_context)
            VALUES (decl.job, coalesce(enqueue_many.queue, decl.queue), a, decl.max_attempts,
                    coalesce(enqueue_many.priority, decl.priority), start_at, decl.timeout,
                    decl.heartbeat, decl.backoff, key,
                    CASE WHEN limited THEN atlantis.limit_group(decl, a, true) END,
                    enqueue_many.trace_context)
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
    delay interval DEFAULT NULL,
    trace_context jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
    SELECT (atlantis.enqueue_many(job_name, ARRAY[args], run_at, priority, queue, delay,
                                  trace_context))[1]
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
               trace_context jsonb)
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
              j.trace_context;
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
                   progress_history = '[]',
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
-- 0026): an operator's atlantis.cancel and a workflow's halt (functions.sql), and the
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
-- available (migration 0026). The rescue asks it; the supervisor's policy
-- (atlantis.supervisor.policy.out_of_attempts) decides the same for the finish statement,
-- and tests/test_rules.py checks that the two agree.
CREATE OR REPLACE FUNCTION atlantis.out_of_attempts(attempt int, max_attempts int)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT attempt >= max_attempts $$;

-- A checkpoint's message as a row keeps it: its first 256 characters (atlantis/limits.py's
-- MAX_PROGRESS_MSG; the supervisor caps it the same way, policy.progress_text, before it
-- is sent; migration 0026).
CREATE OR REPLACE FUNCTION atlantis.progress_text(msg text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT left(msg, 256) $$;


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
    wid bigint;  -- version 17
BEGIN
    -- Version 17: a step (or a compensation) is cancelled with its whole workflow, its
    -- compensations included: a step cancelled alone would strand its dependents.
    SELECT x.workflow_id INTO wid FROM atlantis.jobs x WHERE x.id = cancel.job_id;
    IF wid IS NOT NULL THEN
        PERFORM atlantis.cancel_workflow(wid, who);
        RETURN (SELECT x.state FROM atlantis.jobs x WHERE x.id = cancel.job_id);
    END IF;
    SELECT * INTO j FROM atlantis.jobs WHERE id = cancel.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job with id %', cancel.job_id USING ERRCODE = 'ATL04';
    END IF;
    IF j.state = 'available' THEN
        message := atlantis.cancel_message(who);
        UPDATE atlantis.jobs
           SET state = 'cancelled', finished_at = now(), cancelled_by = who,
               last_error = message, error_count = error_count + 1,
               errors = atlantis.errors_append(errors, atlantis.cancel_entry(j.run, j.attempt, who)
                                                       || jsonb_build_object('at', now()))
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
    IF j.workflow_id IS NOT NULL THEN  -- version 17
        RAISE EXCEPTION 'job % is %step % of workflow %: use tide workflow retry %', j.id,
            CASE WHEN j.compensation THEN 'the compensation of ' ELSE '' END, j.step,
            j.workflow_id, j.workflow_id USING ERRCODE = 'ATL05';
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
         WHERE h.job = j.job AND h.unique_key IS NOT NULL
           AND atlantis.key_digest(h.unique_key) = atlantis.key_digest(j.unique_key)
           AND h.state IN ('available', 'running') AND h.id <> j.id
         LIMIT 1;
        RAISE EXCEPTION 'job % (%) already holds the unique key %; retry job % once it has finished',
            coalesce(holder.id::text, '?'), j.job, atlantis.key_text(j.unique_key), j.id
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
           AND j.workflow_id IS NULL  -- version 17: atlantis.prune_workflows
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
           AND j.workflow_id IS NULL  -- version 17: a workflow's rows go with it, below
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
    IF deleted < batch THEN  -- version 17: finished workflows, with all their rows
        deleted := deleted + atlantis.prune_workflows(older_than, states, batch - deleted::int);
    END IF;
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
-- jobs_fetch_free_idx (queue, priority, run_at, id), which holds the rows no limit applies to;
-- the rows of limited jobs (jobs_limited_idx, ordered by group first) are read in full.
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
     WHERE j.state = 'available' AND j.limit_group IS NULL AND j.queue = q
     ORDER BY j.priority LIMIT 1;
    WHILE p IS NOT NULL LOOP
        SELECT j.run_at INTO first FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.limit_group IS NULL AND j.queue = q AND j.priority = p
         ORDER BY j.run_at LIMIT 1;
        IF first <= now() AND (oldest IS NULL OR first < oldest) THEN
            oldest := first;
        END IF;
        SELECT j.priority INTO p FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.limit_group IS NULL AND j.queue = q AND j.priority > p
         ORDER BY j.priority LIMIT 1;
    END LOOP;
    SELECT min(j.run_at) INTO first FROM atlantis.jobs j
     WHERE j.state = 'available' AND j.limit_group IS NOT NULL AND j.queue = q
       AND j.run_at <= now();
    IF first < oldest OR oldest IS NULL THEN
        oldest := first;
    END IF;
    RETURN oldest;
END
$$;
REVOKE ALL ON FUNCTION atlantis.oldest_due(text) FROM PUBLIC;


-- ---- Workflows (migration 0017) ---------------------------------------------------------
--
-- A workflow's steps are ordinary rows of atlantis.jobs carrying `workflow_id` and `step`
-- (`compensation` true on an undo's row). Every transition of one workflow runs under a
-- lock on its row of atlantis.workflow_instances (FOR NO KEY UPDATE), taken first; the
-- trigger jobs_workflow_advance runs them in the transaction that changed a step's row, so
-- that whoever ends a row (a supervisor of any release, a rescue, an operator) advances its
-- workflow, and a step becomes runnable exactly once.
-- Job rows other than the one that changed are only ever locked with SKIP LOCKED: a
-- transaction holding a step's row (a finish, a claim) may be waiting for the instance, and
-- must never be waited for in turn. A row skipped that way is being changed by someone whose
-- own transition runs after ours and sees our state; atlantis.workflow_sweep sends again any
-- cancel that a skip left unsent.

-- The declaration of `workflow_name` from atlantis.workflow_types; ATL01 when unknown.
CREATE OR REPLACE FUNCTION atlantis.workflow_type(workflow_name text) RETURNS atlantis.workflow_types
LANGUAGE plpgsql STABLE AS $$
DECLARE
    decl atlantis.workflow_types;
BEGIN
    SELECT * INTO decl FROM atlantis.workflow_types t WHERE t.workflow = workflow_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown workflow %', workflow_name
            USING ERRCODE = 'ATL01',
                  HINT = 'sync the declarations into the database: tide db sync --app '
                         'package.module:registry (atlantis-supervise does it at start)';
    END IF;
    RETURN decl;
END
$$;

-- The args a step's job (or a compensation's) takes from its workflow's: the fields the job
-- declares, by name, checked against its declaration (its defaults filled in).
CREATE OR REPLACE FUNCTION atlantis.step_args(job_name text, args jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    decl atlantis.job_types := atlantis.job_type(job_name);
BEGIN
    RETURN atlantis.check_args(decl, coalesce((
        SELECT jsonb_object_agg(a.key, a.value) FROM jsonb_each(step_args.args) AS a
         WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(decl.fields) AS d
                        WHERE d->>'name' = a.key)), '{}'));
END
$$;

-- Insert the row of step `s` (or, `undo`, of its compensation) and record its id. No unique
-- key: a step's job `unique` does not apply inside a workflow.
CREATE OR REPLACE FUNCTION atlantis.workflow_add_step_row(w atlantis.workflow_instances,
                                                          s atlantis.workflow_steps,
                                                          undo boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    job_name text := CASE WHEN undo THEN s.compensate ELSE s.job END;
    decl atlantis.job_types := atlantis.job_type(job_name);
    new_id bigint;
    step_args jsonb := atlantis.step_args(job_name, w.args);
BEGIN
    INSERT INTO atlantis.jobs (job, queue, args, max_attempts, priority, timeout, heartbeat,
                               backoff, workflow_id, step, compensation, limit_group,
                               trace_context)
    VALUES (decl.job, decl.queue, step_args, decl.max_attempts,
            decl.priority, decl.timeout, decl.heartbeat, decl.backoff, w.id, s.step, undo,
            atlantis.limit_group(decl, step_args, EXISTS (
                SELECT 1 FROM atlantis.queues q
                 WHERE q.name = decl.queue AND q.concurrency IS NOT NULL)),
            w.trace_context)
    RETURNING id INTO new_id;
    IF undo THEN
        UPDATE atlantis.workflow_steps ws SET comp_job_id = new_id
         WHERE ws.workflow_id = w.id AND ws.step = s.step;
    ELSE
        UPDATE atlantis.workflow_steps ws SET job_id = new_id
         WHERE ws.workflow_id = w.id AND ws.step = s.step;
    END IF;
    RETURN new_id;
END
$$;

-- The workflow of type `workflow_name` that holds unique key `key`, NULL when none does. A
-- key is held (the index workflow_instances_unique_idx of migration 0022, which this lookup
-- follows) while its workflow is `running` or `compensating`, and while it is
-- `compensation_failed` with its undo still owed: until an operator dismisses it
-- (atlantis.dismiss_workflow). `failed`, `cancelled` and `complete` hold nothing.
CREATE OR REPLACE FUNCTION atlantis.workflow_key_holder(workflow_name text, key text)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT i.id FROM atlantis.workflow_instances i
     WHERE i.workflow = workflow_key_holder.workflow_name AND i.unique_key IS NOT NULL
       AND atlantis.key_digest(i.unique_key) = atlantis.key_digest(workflow_key_holder.key)
       AND i.dismissed_at IS NULL
       AND i.state IN ('running', 'compensating', 'compensation_failed')
     LIMIT 1
$$;

-- Start a workflow in the caller's transaction; returns its id. The args are checked as an
-- enqueue checks a job's (ATL02 naming the workflow and the field), and so are the args
-- each step and compensation will take, now rather than when a step becomes runnable.
-- A workflow declared `unique (...)` returns the id of the one holding the key
-- (atlantis.workflow_key_holder), whatever its state. The steps without `after` get their
-- rows at once.
CREATE OR REPLACE FUNCTION atlantis.start_workflow(name text, args jsonb DEFAULT '{}',
                                                   trace_context jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    decl atlantis.workflow_types := atlantis.workflow_type(start_workflow.name);
    as_job atlantis.job_types;
    checked jsonb;
    key text;
    w atlantis.workflow_instances;
    s atlantis.workflow_steps;
    e jsonb;
    msg text;
    existing bigint;
BEGIN
    as_job.job := decl.workflow;
    as_job.fields := decl.fields;
    as_job.unique_fields := decl.unique_fields;
    BEGIN
        checked := atlantis.check_args(as_job, start_workflow.args);
    EXCEPTION WHEN SQLSTATE 'ATL02' THEN
        GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
        RAISE EXCEPTION 'workflow %', substr(msg, 5) USING ERRCODE = 'ATL02';
    END;
    FOR e IN SELECT x FROM jsonb_array_elements(decl.steps) AS x LOOP
        BEGIN
            PERFORM atlantis.step_args(e->>'job', checked);
            IF e->>'compensate' IS NOT NULL THEN
                PERFORM atlantis.step_args(e->>'compensate', checked);
            END IF;
        EXCEPTION WHEN SQLSTATE 'ATL02' THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
            RAISE EXCEPTION 'workflow %, step %: %', decl.workflow, e->>'step', msg
                USING ERRCODE = 'ATL02';
        END;
    END LOOP;
    key := atlantis.unique_key(as_job, checked);
    LOOP
        -- Version 22: no conflict target: the unique index decides which states hold a key
        -- (workflow_instances_unique_idx), and the holder is looked up after.
        INSERT INTO atlantis.workflow_instances (workflow, args, unique_key, deadline,
                                                 trace_context)
        VALUES (decl.workflow, checked, key, now() + decl.timeout, start_workflow.trace_context)
        ON CONFLICT DO NOTHING
        RETURNING * INTO w;
        EXIT WHEN FOUND;
        existing := atlantis.workflow_key_holder(decl.workflow, key);
        IF existing IS NOT NULL THEN
            RETURN existing;
        END IF;
    END LOOP;
    INSERT INTO atlantis.workflow_steps (workflow_id, step, ord, job, after, compensate,
                                         pending)
    SELECT w.id, x.e->>'step', x.o::int, x.e->>'job', d.after, x.e->>'compensate',
           cardinality(d.after)
      FROM jsonb_array_elements(decl.steps) WITH ORDINALITY AS x(e, o)
     CROSS JOIN LATERAL (
            SELECT coalesce(array_agg(DISTINCT a), '{}') AS after
              FROM jsonb_array_elements_text(x.e->'after') AS a) d;
    IF NOT FOUND THEN  -- no steps: nothing to do
        UPDATE atlantis.workflow_instances SET state = 'complete', finished_at = now()
         WHERE id = w.id;
        RETURN w.id;
    END IF;
    FOR s IN SELECT * FROM atlantis.workflow_steps ws
              WHERE ws.workflow_id = w.id AND ws.pending = 0 ORDER BY ws.ord LOOP
        PERFORM atlantis.workflow_add_step_row(w, s, false);
    END LOOP;
    RETURN w.id;
END
$$;

-- Each step of a workflow with its row's state (`fwd`), its compensation's (`comp`), whether
-- it `started` (a child began its handler at least once: a completed step, or one with an
-- attempt recorded by a child or rescued by lease expiry; a row claimed ahead and given
-- back unspent did not), and whether it is `settled`: it never got a row, or its row ended
-- and nothing of it is left to undo (it did not start, has no compensation, or its
-- compensation completed).
CREATE OR REPLACE FUNCTION atlantis.workflow_step_states(wid bigint)
RETURNS TABLE (step text, ord int, job text, after text[], compensate text, job_id bigint,
               comp_job_id bigint, fwd text, comp text, started boolean, settled boolean)
LANGUAGE sql STABLE AS $$
    SELECT st.step, st.ord, st.job, st.after, st.compensate, st.job_id, st.comp_job_id,
           st.fwd, st.comp, st.started,
           st.job_id IS NULL OR st.fwd IS NULL
               OR (st.fwd IN ('complete', 'dead', 'cancelled')
                   AND (NOT st.started OR st.compensate IS NULL
                        OR st.comp IS NOT DISTINCT FROM 'complete'))
      FROM (SELECT ws.step, ws.ord, ws.job, ws.after, ws.compensate, ws.job_id,
                   ws.comp_job_id, f.state AS fwd, c.state AS comp,
                   f.state = 'complete' OR EXISTS (
                       SELECT 1 FROM atlantis.attempts a
                        WHERE a.job_id = ws.job_id
                          AND (a.child_pid IS NOT NULL OR a.outcome = 'lease_expired'))
                       AS started
              FROM atlantis.workflow_steps ws
              LEFT JOIN atlantis.jobs f ON f.id = ws.job_id
              LEFT JOIN atlantis.jobs c ON c.id = ws.comp_job_id
             WHERE ws.workflow_id = wid) st
$$;

-- Stop the forward steps of a workflow that stopped: those waiting never start (they end
-- `cancelled` at once); those running are cancelled as `tide job cancel` does (the
-- supervisor tells the handler, then stops it after its grace). Rows another transaction
-- holds are skipped (see above). Returns how many rows it changed.
CREATE OR REPLACE FUNCTION atlantis.workflow_halt(wid bigint) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w atlantis.workflow_instances;
    who text;
    message text;
    r record;
    n int := 0;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = wid;
    who := coalesce(w.cancelled_by, format('workflow %s', wid));
    message := atlantis.cancel_message(who);
    FOR r IN SELECT j.id FROM atlantis.jobs j
              WHERE j.workflow_id = wid AND NOT j.compensation AND j.state = 'available'
              ORDER BY j.id FOR NO KEY UPDATE SKIP LOCKED LOOP
        UPDATE atlantis.jobs j
           SET state = 'cancelled', finished_at = now(), cancelled_by = who,
               last_error = message, error_count = j.error_count + 1,
               errors = atlantis.errors_append(j.errors, atlantis.cancel_entry(j.run, j.attempt, who)
                                                         || jsonb_build_object('at', now()))
         WHERE j.id = r.id AND j.state = 'available';
        n := n + 1;
    END LOOP;
    FOR r IN SELECT j.id, j.claimed_by FROM atlantis.jobs j
              WHERE j.workflow_id = wid AND NOT j.compensation AND j.state = 'running'
                AND j.cancel_requested_at IS NULL
              ORDER BY j.id FOR NO KEY UPDATE SKIP LOCKED LOOP
        UPDATE atlantis.jobs j SET cancel_requested_at = now(), cancelled_by = who
         WHERE j.id = r.id;
        PERFORM pg_notify('atlantis_control', json_build_object(
            'op', 'cancel', 'job_id', r.id, 'worker', r.claimed_by)::text);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- A running workflow stops (`why`: failed, cancelled or timeout; `step_name`: the step that
-- failed, NULL for a cancel or a timeout): it turns `compensating`, its steps are halted,
-- and the compensations that may start do.
CREATE OR REPLACE FUNCTION atlantis.workflow_stop(wid bigint, why text, step_name text,
                                                  message text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE atlantis.workflow_instances i
       SET state = 'compensating', cause = why, failed_step = step_name, error = message
     WHERE i.id = wid AND i.state = 'running';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('atlantis_workflows', wid::text);
    PERFORM atlantis.workflow_halt(wid);
    PERFORM atlantis.workflow_settle(wid);
END
$$;

-- The compensation phase, one step further: start the compensation of every step that
-- started, has left `running`, and whose dependents are all settled (reverse dependency
-- order; independent branches at once); then end the workflow when every step is settled
-- (`failed` or `cancelled`, by its cause), or `compensation_failed` when nothing is left
-- running and something could not be undone (a compensation ended dead or cancelled, or
-- its row could not be made). Safe to call again at any time. Returns the state after.
CREATE OR REPLACE FUNCTION atlantis.workflow_settle(wid bigint) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w atlantis.workflow_instances;
    s atlantis.workflow_steps;
    ready text;
    msg text;
    all_settled boolean;
    busy boolean;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = wid;
    IF NOT FOUND OR w.state <> 'compensating' THEN
        RETURN w.state;
    END IF;
    FOR ready IN
        SELECT f.step FROM atlantis.workflow_step_states(wid) f
         WHERE NOT f.settled AND f.started AND f.compensate IS NOT NULL
           AND f.comp_job_id IS NULL AND f.fwd IN ('complete', 'dead', 'cancelled')
           AND NOT EXISTS (SELECT 1 FROM atlantis.workflow_step_states(wid) d
                            WHERE f.step = ANY (d.after) AND NOT d.settled)
         ORDER BY f.ord DESC
    LOOP
        SELECT * INTO s FROM atlantis.workflow_steps ws
         WHERE ws.workflow_id = wid AND ws.step = ready;
        BEGIN
            PERFORM atlantis.workflow_add_step_row(w, s, true);
        EXCEPTION WHEN SQLSTATE 'ATL01' OR SQLSTATE 'ATL02' OR data_exception
                       OR integrity_constraint_violation THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
            UPDATE atlantis.workflow_instances i
               SET error = format('%s; the compensation of step %s could not start: %s',
                                  w.error, ready, msg)
             WHERE i.id = wid;
        END;
    END LOOP;
    SELECT bool_and(f.settled),
           coalesce(bool_or(f.fwd IN ('available', 'running')
                            OR f.comp IN ('available', 'running')), false)
      INTO all_settled, busy
      FROM atlantis.workflow_step_states(wid) f;
    IF all_settled THEN
        UPDATE atlantis.workflow_instances i
           SET state = CASE WHEN i.cause = 'cancelled' THEN 'cancelled' ELSE 'failed' END,
               finished_at = now()
         WHERE i.id = wid RETURNING * INTO w;
        PERFORM pg_notify('atlantis_workflows', wid::text);
    ELSIF NOT busy THEN
        UPDATE atlantis.workflow_instances i
           SET state = 'compensation_failed', finished_at = now()
         WHERE i.id = wid RETURNING * INTO w;
        PERFORM pg_notify('atlantis_workflows', wid::text);
    END IF;
    RETURN w.state;
END
$$;

-- Trigger jobs_workflow_advance (AFTER UPDATE OF state, on rows of a workflow, when the
-- state changed to anything but running): the workflow's transition for that change.
-- - A step complete: each dependent whose dependencies are now all complete gets its row
--   (exactly once: the instance's lock orders concurrent completions, and `pending` counts
--   down once per dependency); the last step complete completes the workflow.
-- - A step dead: the workflow fails (compensating). A step cancelled: the workflow is
--   cancelled (an operator's SQL; atlantis.cancel cancels the workflow itself).
-- - A step that went back to wait (a retry's backoff, a snooze, a drain) in a workflow that
--   stopped meanwhile never runs again: it is cancelled.
-- - In the compensation phase, any change of a step's or a compensation's row may let the
--   next compensations start, or end the workflow.
CREATE OR REPLACE FUNCTION atlantis.workflow_advance() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    s atlantis.workflow_steps;
    ready text[];
    name text;
    msg text;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = NEW.workflow_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF w.state <> 'running' THEN
        IF NEW.state = 'available' AND NOT NEW.compensation
           AND w.state IN ('compensating', 'failed', 'cancelled', 'compensation_failed') THEN
            PERFORM atlantis.workflow_halt(w.id);  -- this row among them (ours: never skipped)
        END IF;
        PERFORM atlantis.workflow_settle(w.id);
        RETURN NULL;
    END IF;
    IF NEW.compensation THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'complete' THEN
        WITH d AS (
            UPDATE atlantis.workflow_steps ws SET pending = ws.pending - 1
             WHERE ws.workflow_id = w.id AND NEW.step = ANY (ws.after) AND ws.job_id IS NULL
               AND ws.pending > 0
            RETURNING ws.step, ws.ord, ws.pending
        )
        SELECT array_agg(d.step ORDER BY d.ord) INTO ready FROM d WHERE d.pending = 0;
        FOREACH name IN ARRAY coalesce(ready, '{}') LOOP
            SELECT * INTO s FROM atlantis.workflow_steps ws
             WHERE ws.workflow_id = w.id AND ws.step = name;
            BEGIN
                PERFORM atlantis.workflow_add_step_row(w, s, false);
            EXCEPTION WHEN SQLSTATE 'ATL01' OR SQLSTATE 'ATL02' OR data_exception
                           OR integrity_constraint_violation THEN
                GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
                PERFORM atlantis.workflow_stop(w.id, 'failed', name,
                                               format('step %s could not start: %s', name, msg));
                RETURN NULL;
            END;
        END LOOP;
        IF NOT EXISTS (SELECT 1 FROM atlantis.workflow_steps ws
                         LEFT JOIN atlantis.jobs j ON j.id = ws.job_id
                        WHERE ws.workflow_id = w.id AND j.state IS DISTINCT FROM 'complete') THEN
            UPDATE atlantis.workflow_instances i SET state = 'complete', finished_at = now()
             WHERE i.id = w.id;
            PERFORM pg_notify('atlantis_workflows', w.id::text);
        END IF;
    ELSIF NEW.state = 'dead' THEN
        PERFORM atlantis.workflow_stop(w.id, 'failed', NEW.step,
                                       format('step %s failed: %s', NEW.step,
                                              coalesce(NEW.last_error, 'dead')));
    ELSIF NEW.state = 'cancelled' THEN
        UPDATE atlantis.workflow_instances i
           SET cancel_requested_at = now(), cancelled_by = coalesce(NEW.cancelled_by, i.cancelled_by)
         WHERE i.id = w.id;
        PERFORM atlantis.workflow_stop(w.id, 'cancelled', NULL,
                                       coalesce(NEW.last_error, 'cancelled'));
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION atlantis.workflow_advance() FROM PUBLIC;

-- The workflow an operator acts on, locked (FOR NO KEY UPDATE); ATL04 when there is none.
-- One home for what cancel_workflow, retry_workflow and dismiss_workflow each begin with.
CREATE OR REPLACE FUNCTION atlantis.workflow_for_operator(workflow_id bigint)
RETURNS atlantis.workflow_instances
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w atlantis.workflow_instances;
BEGIN
    SELECT * INTO w FROM atlantis.workflow_instances i
     WHERE i.id = workflow_for_operator.workflow_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no workflow with id %', workflow_for_operator.workflow_id
            USING ERRCODE = 'ATL04';
    END IF;
    RETURN w;
END
$$;
REVOKE ALL ON FUNCTION atlantis.workflow_for_operator(bigint) FROM PUBLIC;

-- Cancel a workflow: its running steps are cancelled (with their grace), none starts, and
-- the compensations run as after a failure. During the compensation the cancel is recorded
-- and the compensations go on; a finished workflow is left alone. Returns its state
-- afterwards. `by` as atlantis.cancel's.
CREATE OR REPLACE FUNCTION atlantis.cancel_workflow(workflow_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    who text := coalesce(cancel_workflow.by, current_user);
BEGIN
    w := atlantis.workflow_for_operator(cancel_workflow.workflow_id);
    IF w.state IN ('running', 'compensating') AND w.cancel_requested_at IS NULL THEN
        UPDATE atlantis.workflow_instances i SET cancel_requested_at = now(), cancelled_by = who
         WHERE i.id = w.id;
    END IF;
    IF w.state = 'running' THEN
        PERFORM atlantis.workflow_stop(w.id, 'cancelled', NULL, atlantis.cancel_message(who));
    END IF;
    RETURN (SELECT i.state FROM atlantis.workflow_instances i WHERE i.id = w.id);
END
$$;

-- Rerun the compensations of a `compensation_failed` workflow that ended dead or cancelled
-- (a fresh attempt budget each, as atlantis.retry gives) and carry on from there; others
-- are refused (ATL05). A dismissed one is retried too (its dismissal is cleared): it takes
-- its unique key back, refused (ATL03, naming the holder) while another workflow holds it.
-- Returns the state afterwards.
CREATE OR REPLACE FUNCTION atlantis.retry_workflow(workflow_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    who text := coalesce(retry_workflow.by, current_user);
    r record;
    holder bigint;  -- version 22
BEGIN
    w := atlantis.workflow_for_operator(retry_workflow.workflow_id);
    IF w.state <> 'compensation_failed' THEN
        RAISE EXCEPTION 'workflow % is %: only a compensation_failed workflow can be retried',
            w.id, w.state USING ERRCODE = 'ATL05';
    END IF;
    BEGIN
        UPDATE atlantis.workflow_instances i
           SET state = 'compensating', finished_at = NULL, retried_by = who, retried_at = now(),
               dismissed_at = NULL, dismissed_by = NULL  -- version 22
         WHERE i.id = w.id;
    EXCEPTION WHEN unique_violation THEN
        -- Version 22: dismissed, its key was free, and another workflow took it since.
        holder := atlantis.workflow_key_holder(w.workflow, w.unique_key);
        RAISE EXCEPTION 'workflow % (%) holds the unique key % now; retry workflow % once '
                        'workflow % has finished or been dismissed',
            coalesce(holder::text, '?'), w.workflow, w.unique_key, w.id,
            coalesce(holder::text, '?') USING ERRCODE = 'ATL03';
    END;
    FOR r IN SELECT j.id, j.queue FROM atlantis.jobs j
              WHERE j.workflow_id = w.id AND j.compensation AND j.state IN ('dead', 'cancelled')
              ORDER BY j.id FOR NO KEY UPDATE LOOP
        UPDATE atlantis.jobs j
           SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
               claimed_by = NULL, claimed_until = NULL, cancel_requested_at = NULL,
               cancelled_by = NULL, progress_pct = NULL, progress_msg = NULL,
               progress_at = NULL, progress_history = '[]', last_error = NULL,
               retried_by = who, retried_at = now()
         WHERE j.id = r.id;
        PERFORM pg_notify('atlantis_jobs', r.queue);
    END LOOP;
    PERFORM pg_notify('atlantis_workflows', w.id::text);
    RETURN atlantis.workflow_settle(w.id);
END
$$;

-- Give up the owed undo of a `compensation_failed` workflow: it stays compensation_failed
-- (the state set does not grow), is recorded as dismissed (`dismissed_at`, `dismissed_by`)
-- and frees its unique key, so that a workflow of the same key may start. Others are refused
-- (ATL05); dismissing again changes nothing. `by` as atlantis.cancel's. Returns the state.
CREATE OR REPLACE FUNCTION atlantis.dismiss_workflow(workflow_id bigint, by text DEFAULT current_user)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workflow_instances;
    who text := coalesce(dismiss_workflow.by, current_user);
BEGIN
    w := atlantis.workflow_for_operator(dismiss_workflow.workflow_id);
    IF w.state <> 'compensation_failed' THEN
        RAISE EXCEPTION 'workflow % is %: only a compensation_failed workflow can be dismissed',
            w.id, w.state USING ERRCODE = 'ATL05';
    END IF;
    IF w.dismissed_at IS NULL THEN
        UPDATE atlantis.workflow_instances i SET dismissed_at = now(), dismissed_by = who
         WHERE i.id = w.id;
        PERFORM pg_notify('atlantis_workflows', w.id::text);
    END IF;
    RETURN w.state;
END
$$;

-- What a step's handler gets besides its args (the claim returns it): its workflow and step,
-- whether it is a compensation, `results` (each transitive predecessor's result by step
-- name; in a compensation, the undone step's result and its own `results`), and
-- `compensating` (in a compensation: the failed step, NULL for a cancel or a timeout, and
-- the workflow's error). NULL for a job outside workflows.
CREATE OR REPLACE FUNCTION atlantis.step_context(job_id bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    j record;
    w atlantis.workflow_instances;
    found_results jsonb;
BEGIN
    SELECT x.workflow_id, x.step, x.compensation INTO j FROM atlantis.jobs x
     WHERE x.id = step_context.job_id;
    IF NOT FOUND OR j.workflow_id IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO w FROM atlantis.workflow_instances i WHERE i.id = j.workflow_id;
    WITH RECURSIVE up(name) AS (
        SELECT a.name FROM atlantis.workflow_steps ws CROSS JOIN LATERAL unnest(ws.after) AS a(name)
         WHERE ws.workflow_id = j.workflow_id AND ws.step = j.step
        UNION
        SELECT a.name FROM up
          JOIN atlantis.workflow_steps ws ON ws.workflow_id = j.workflow_id AND ws.step = up.name
         CROSS JOIN LATERAL unnest(ws.after) AS a(name)
    )
    SELECT coalesce(jsonb_object_agg(ws.step, r.result), '{}') INTO found_results
      FROM atlantis.workflow_steps ws
      LEFT JOIN atlantis.jobs r ON r.id = ws.job_id
     WHERE ws.workflow_id = j.workflow_id
       AND (ws.step IN (SELECT up.name FROM up) OR (j.compensation AND ws.step = j.step));
    RETURN jsonb_build_object(
        'workflow_id', j.workflow_id, 'step', j.step, 'compensation', j.compensation,
        'results', found_results,
        'compensating', CASE WHEN j.compensation THEN jsonb_build_object(
                                  'step', w.failed_step, 'error', w.error) END);
END
$$;

-- What only time finds: running workflows past their deadline fail (cause `timeout`); and
-- a stopped workflow's steps that a race left waiting, or running without a cancel request,
-- are halted again. Supervisors call it every rescue interval; locked instances are
-- skipped. Returns how many workflows it acted on.
CREATE OR REPLACE FUNCTION atlantis.workflow_sweep(batch int DEFAULT 100) RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w record;
    n int := 0;
BEGIN
    FOR w IN SELECT i.id, i.deadline - i.created_at AS took FROM atlantis.workflow_instances i
              WHERE i.state = 'running' AND i.deadline < now()
              ORDER BY i.deadline LIMIT batch FOR NO KEY UPDATE SKIP LOCKED LOOP
        PERFORM atlantis.workflow_stop(w.id, 'timeout', NULL,
                                       format('workflow timeout after %s', w.took));
        n := n + 1;
    END LOOP;
    FOR w IN SELECT i.id FROM atlantis.workflow_instances i
              WHERE i.state = 'compensating'
                AND EXISTS (SELECT 1 FROM atlantis.jobs j
                             WHERE j.workflow_id = i.id AND NOT j.compensation
                               AND (j.state = 'available'
                                    OR (j.state = 'running' AND j.cancel_requested_at IS NULL)))
              ORDER BY i.id LIMIT batch FOR NO KEY UPDATE SKIP LOCKED LOOP
        PERFORM atlantis.workflow_halt(w.id);
        PERFORM atlantis.workflow_settle(w.id);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- Delete at most `batch` finished workflows that finished more than `older_than` ago, with
-- every row of their steps and compensations (and those rows' attempts and logs): a step is
-- never pruned alone. `states` as atlantis.prune's: `complete` prunes complete workflows,
-- `cancelled` cancelled ones, `dead` failed and compensation_failed ones. Returns how many
-- job rows went.
CREATE OR REPLACE FUNCTION atlantis.prune_workflows(older_than interval,
                                         states text[] DEFAULT ARRAY['complete', 'cancelled', 'dead'],
                                         batch int DEFAULT 100) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH doomed AS (
        SELECT i.id FROM atlantis.workflow_instances i
         WHERE i.finished_at IS NOT NULL AND i.finished_at < now() - older_than
           AND CASE i.state WHEN 'complete' THEN 'complete' = ANY (states)
                            WHEN 'cancelled' THEN 'cancelled' = ANY (states)
                            WHEN 'failed' THEN 'dead' = ANY (states)
                            WHEN 'compensation_failed' THEN 'dead' = ANY (states)
                            ELSE false END
         ORDER BY i.finished_at
         LIMIT greatest(coalesce(batch, 100), 1)
           FOR UPDATE SKIP LOCKED
    ), instances AS (
        DELETE FROM atlantis.workflow_instances i USING doomed WHERE i.id = doomed.id
        RETURNING i.id
    ), gone AS (
        DELETE FROM atlantis.jobs j USING instances WHERE j.workflow_id = instances.id
        RETURNING j.id
    ), attempts AS (
        DELETE FROM atlantis.attempts a WHERE a.job_id IN (SELECT id FROM gone)
    ), logs AS (
        DELETE FROM atlantis.logs l WHERE l.job_id IN (SELECT id FROM gone)
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;


-- ---- Limits (migration 0018) ------------------------------------------------------------
-- A row of a limited job turns `running` only through the trigger jobs_limit_claim
-- (atlantis.limit_claim). Each limit that applies to the row has a key; under a
-- transaction-scoped advisory lock per key, taken in one fixed order and never waited for, the
-- trigger counts what the key holds in a snapshot taken after the lock: running rows for a
-- concurrency limit (so a slot is free the moment its row leaves `running`, by any path, in
-- that transaction), open windows of atlantis.limit_starts for a rate. A full limit leaves
-- the row `available`, untouched: the claim statement does not return it.

-- The canonical values of `by` fields of `args` (as unique keys take them), a JSON array.
-- PL/pgSQL of simple expressions: its plans are kept, and it runs for every running row a
-- limit counts.
CREATE OR REPLACE FUNCTION atlantis.limit_value(decl atlantis.job_types, args jsonb, by text[])
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    out jsonb := '[]';
    f text;
    d jsonb;
BEGIN
    FOREACH f IN ARRAY coalesce(by, '{}') LOOP
        d := jsonb_path_query_first(decl.fields, '$[*] ? (@.name == $n)',
                                    jsonb_build_object('n', f));
        out := out || jsonb_build_array(atlantis.canonical_value(
            d->>'type', coalesce((d->>'array')::boolean, false), args->f));
    END LOOP;
    RETURN out;
END
$$;

-- The `by` fields of every limit of `limits`, in order of first appearance: what a row's
-- group is made of.
CREATE OR REPLACE FUNCTION atlantis.limit_fields(limits jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    every jsonb := jsonb_path_query_array(coalesce(limits, '[]'), '$[*].by[*]');
    out text[] := '{}';
    f text;
BEGIN
    FOR i IN 0 .. jsonb_array_length(every) - 1 LOOP
        f := every->>i;
        IF NOT f = ANY (out) THEN
            out := out || f;
        END IF;
    END LOOP;
    RETURN out;
END
$$;

-- A row's group (jobs.limit_group): NULL when no limit applies, '' when its job's limits
-- name no `by` field, else the digest (atlantis.key_digest) of the values of every `by`
-- field they name, in order, as JSON (migration 0021: any value the args accept).
CREATE OR REPLACE FUNCTION atlantis.limit_group(decl atlantis.job_types, args jsonb,
                                                queue_limited boolean) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    fields text[];
BEGIN
    IF decl.job IS NULL OR jsonb_array_length(decl.limits) = 0 THEN
        RETURN CASE WHEN queue_limited THEN '' END;
    END IF;
    fields := atlantis.limit_fields(decl.limits);
    IF cardinality(fields) = 0 THEN
        RETURN '';
    END IF;
    RETURN atlantis.key_digest(atlantis.limit_value(decl, args, fields)::text);
END
$$;

-- A period as .atl writes it, in the largest unit that divides it exactly (as
-- atlantis.declarations.model.period_text): 1m, 5s, 1h, 1d, 90s, 1s500ms.
CREATE OR REPLACE FUNCTION atlantis.limit_period_text(period interval) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ms % 86400000 = 0 THEN (ms / 86400000) || 'd'
                WHEN ms % 3600000 = 0 THEN (ms / 3600000) || 'h'
                WHEN ms % 60000 = 0 THEN (ms / 60000) || 'm'
                WHEN ms % 1000 = 0 THEN (ms / 1000) || 's'
                WHEN ms > 1000 THEN (ms / 1000) || 's' || (ms % 1000) || 'ms'
                ELSE ms || 'ms' END
      FROM (SELECT round(extract(epoch FROM period) * 1000)::bigint AS ms) p
$$;

-- The limits that apply to a row of `decl` on queue `q` with `args` now, in one fixed order
-- (the job's, as declared, then its queue's): its key (what the advisory lock and
-- atlantis.limit_starts are keyed on: the digest of the job, kind and values, migration
-- 0021), kind, N, period (rate), `by` fields and their
-- values, scope (`group`: one of the row's by-values; `job`: all of its job; `queue`: all
-- of its queue), the label operators read, and whether its `by` fields are all of the
-- group's (`whole`: rows of the same key have the same limit_group). PL/pgSQL of simple
-- expressions, but for the queue's lookup: the trigger runs it for every limited claim.
CREATE OR REPLACE FUNCTION atlantis.limit_rows(decl atlantis.job_types, q text, args jsonb)
RETURNS atlantis.limit_row[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    out atlantis.limit_row[] := '{}';
    l jsonb;
    r atlantis.limit_row;
    group_fields text[];
    key_by text;
    label_by text;
    v jsonb;
    qc int;
BEGIN
    IF decl.job IS NOT NULL AND jsonb_array_length(decl.limits) > 0 THEN
        group_fields := atlantis.limit_fields(decl.limits);
        FOR i IN 0 .. jsonb_array_length(decl.limits) - 1 LOOP
            l := decl.limits->i;
            r.kind := l->>'kind';
            r.n := (l->>'n')::int;
            r.period := CASE WHEN r.kind = 'rate'
                             THEN make_interval(secs => (l->>'period')::double precision) END;
            r.fields := '{}';
            FOR k IN 0 .. jsonb_array_length(coalesce(l->'by', '[]')) - 1 LOOP
                r.fields := r.fields || (l->'by'->>k);
            END LOOP;
            r.val := atlantis.limit_value(decl, args, r.fields);
            key_by := '';
            label_by := '';
            FOR k IN 1 .. cardinality(r.fields) LOOP
                v := r.val->(k - 1);
                key_by := key_by || CASE WHEN k > 1 THEN ', ' ELSE ' by ' END
                          || r.fields[k] || '=' || v::text;
                label_by := label_by || CASE WHEN k > 1 THEN ', ' ELSE ' by ' END
                            || r.fields[k] || '='
                            || atlantis.key_text(CASE WHEN jsonb_typeof(v) = 'string'
                                                      THEN v #>> '{}' ELSE v::text END);
            END LOOP;
            r.key := atlantis.key_digest(decl.job || ' ' || r.kind || key_by);
            r.scope := CASE WHEN cardinality(r.fields) = 0 THEN 'job' ELSE 'group' END;
            r.label := r.kind || ' ' || r.n
                       || CASE WHEN r.kind = 'rate'
                               THEN '/' || atlantis.limit_period_text(r.period) ELSE '' END
                       || label_by;
            r.whole := r.fields = group_fields;
            out := out || r;
        END LOOP;
    END IF;
    SELECT qq.concurrency INTO qc FROM atlantis.queues qq
     WHERE qq.name = q AND qq.concurrency IS NOT NULL;
    IF qc IS NOT NULL THEN
        out := out || ROW('queue ' || q, 'concurrency', qc, NULL::interval, '{}'::text[],
                          '[]'::jsonb, 'queue', 'queue ' || q || ' concurrency ' || qc,
                          false)::atlantis.limit_row;
    END IF;
    RETURN out;
END
$$;

-- atlantis.limit_rows as rows (tide, the console, atlantis.limit_hold).
CREATE OR REPLACE FUNCTION atlantis.row_limits(decl atlantis.job_types, q text, args jsonb)
RETURNS TABLE (key text, kind text, n int, period interval, fields text[], val jsonb, scope text,
               label text, whole boolean)
LANGUAGE sql STABLE AS $$
    SELECT * FROM unnest(atlantis.limit_rows(decl, q, args))
$$;

-- The running rows a concurrency limit counts: of the queue (scope `queue`), or of the
-- job with the same values of `by` (none: all of the job's). When the limit's `by` fields
-- make the whole group (`whole`), its rows are found by their limit_group
-- (jobs_limited_running_idx); otherwise each running row of the job is compared.
CREATE OR REPLACE FUNCTION atlantis.limit_holders(decl atlantis.job_types, q text, scope text,
                                                  by text[], val jsonb, whole boolean)
RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT r.id FROM atlantis.jobs r
     WHERE scope = 'queue' AND r.state = 'running' AND r.queue = q
    UNION ALL
    SELECT r.id FROM atlantis.jobs r
     WHERE scope <> 'queue' AND whole AND r.state = 'running' AND r.limit_group IS NOT NULL
       AND r.job = decl.job AND r.limit_group = CASE WHEN cardinality(by) = 0 THEN ''
                                                     ELSE atlantis.key_digest(val::text) END
    UNION ALL
    SELECT r.id FROM atlantis.jobs r
     WHERE scope <> 'queue' AND NOT whole AND r.state = 'running' AND r.limit_group IS NOT NULL
       AND r.job = decl.job
       AND (cardinality(by) = 0 OR atlantis.limit_value(decl, r.args, by) = val)
$$;

-- A claim of a limited row was refused: tell atlantis.claim_limited what to skip for the
-- rest of its call (`scope`: `queue`, `job:NAME`, `group`), and when trying again makes
-- sense (`wake`; the earliest wins). Returns false: called in an assignment, which PL/pgSQL
-- evaluates without a statement of its own.
CREATE OR REPLACE FUNCTION atlantis.limit_refuse(scope text, wake timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    was text := nullif(current_setting('atlantis.limit_wake', true), '');
    ignored text;
BEGIN
    ignored := set_config('atlantis.limit_refused', scope, true);
    IF wake IS NOT NULL AND (was IS NULL OR wake < was::timestamptz) THEN
        ignored := set_config('atlantis.limit_wake', wake::text, true);
    END IF;
    RETURN false;
END
$$;

-- Trigger jobs_limit_claim: BEFORE a limited row turns `running`. Returns NULL (the row is
-- left as it was) unless every limit that applies has room; then records the rate starts.
-- The locks are tried, never waited for: claimers taking keys in any order cannot deadlock;
-- one that finds a key taken comes back 25 ms later. The counts run after the locks, each
-- in a snapshot of its own (a VOLATILE function's statements take one each under READ
-- COMMITTED): every claim of the key that committed before the lock was taken is counted,
-- and none can be in progress. A rate-limited attempt's started_at is the clock time its
-- start was recorded at, so the windows and the attempts agree.
CREATE OR REPLACE FUNCTION atlantis.limit_claim() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    decl atlantis.job_types;
    ls atlantis.limit_row[];
    l atlantis.limit_row;
    c timestamptz;
    cnt bigint;
    frees timestamptz;
    rated boolean := false;
    ignored boolean;
BEGIN
    SELECT t.* INTO decl FROM atlantis.job_types t WHERE t.job = NEW.job;
    ls := atlantis.limit_rows(decl, NEW.queue, NEW.args);
    FOREACH l IN ARRAY ls LOOP
        IF NOT pg_try_advisory_xact_lock(1635019891, hashtext(l.key)) THEN
            ignored := atlantis.limit_refuse(
                CASE l.scope WHEN 'job' THEN 'job:' || NEW.job ELSE l.scope END,
                clock_timestamp() + interval '25 milliseconds');
            RETURN NULL;
        END IF;
    END LOOP;
    c := clock_timestamp();
    FOREACH l IN ARRAY ls LOOP
        IF l.kind = 'concurrency' THEN
            IF l.scope = 'queue' THEN
                SELECT count(*) INTO cnt FROM atlantis.jobs r
                 WHERE r.state = 'running' AND r.queue = NEW.queue;
            ELSIF l.whole THEN
                SELECT count(*) INTO cnt FROM atlantis.jobs r
                 WHERE r.state = 'running' AND r.limit_group IS NOT NULL AND r.job = NEW.job
                   AND r.limit_group = CASE WHEN l.scope = 'job' THEN ''
                                            ELSE atlantis.key_digest(l.val::text) END;
            ELSE
                SELECT count(*) INTO cnt
                  FROM atlantis.limit_holders(decl, NEW.queue, l.scope, l.fields, l.val, false);
            END IF;
            IF cnt >= l.n THEN
                ignored := atlantis.limit_refuse(
                    CASE l.scope WHEN 'job' THEN 'job:' || NEW.job ELSE l.scope END, NULL);
                RETURN NULL;
            END IF;
        ELSE
            SELECT count(*), min(s.until) INTO cnt, frees FROM atlantis.limit_starts s
             WHERE s.key = l.key AND s.until > c;
            IF cnt >= l.n THEN
                IF cnt > l.n THEN  -- the limit was lowered: the window frees later
                    SELECT s.until INTO frees FROM atlantis.limit_starts s
                     WHERE s.key = l.key AND s.until > c
                     ORDER BY s.until OFFSET cnt - l.n LIMIT 1;
                END IF;
                ignored := atlantis.limit_refuse(
                    CASE l.scope WHEN 'job' THEN 'job:' || NEW.job ELSE l.scope END, frees);
                RETURN NULL;
            END IF;
        END IF;
    END LOOP;
    FOREACH l IN ARRAY ls LOOP
        IF l.kind = 'rate' THEN
            INSERT INTO atlantis.limit_starts (key, job_id, at, until)
            VALUES (l.key, NEW.id, c, c + l.period);
            rated := true;
        END IF;
    END LOOP;
    IF rated THEN
        NEW.started_at := c;
    END IF;
    IF NEW.limit_group = '' THEN  -- marked by a claim or a queue limit: its real group
        NEW.limit_group := coalesce(atlantis.limit_group(decl, NEW.args, true), '');
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION atlantis.limit_claim() FROM PUBLIC;

-- Claim up to `n` due rows of limited jobs (jobs.limit_group set) of `jobs` on `queues`, for
-- idle children only (never ahead). Priority first. Within a priority the groups take turns:
-- the groups are found by index probes of jobs_limited_idx (queue, priority, limit_group,
-- ...), at most `span` a priority and call, starting after `after` (the last group the
-- previous call tried: the groups rotate across calls, whatever their number) and wrapping
-- around; each statement then claims the first due row of as many untried groups as rows
-- are wanted, the trigger deciding for each, until enough are claimed; a round of the
-- groups that claimed something starts again from the first for their next rows. A group
-- whose row was refused is skipped for the rest of the call, as are the job and the queue
-- when the refusal was theirs (atlantis.limit_refuse): no row waits behind a full limit.
-- Returns the claimed rows as the `claim` query does, then one row with a NULL id:
-- `wake_in`, in how many seconds to claim again (a rate window frees, a key's lock was
-- taken, or groups were left untried; NULL: nothing to wait for), and `cursor`, the `after`
-- of the next call.
CREATE OR REPLACE FUNCTION atlantis.claim_limited(queues text[], jobs text[], worker text, n int,
                                                  after text DEFAULT NULL)
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               wake_in float8, cursor text)
LANGUAGE plpgsql VOLATILE
-- Its statements' plans are made once (a custom plan each call costs more than the call).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    span int := greatest(2 * claim_limited.n + 4, 8);
    q text;
    p int;
    groups text[];
    pending text[];
    tried text[];
    won text[];
    took bigint[];
    claimed bigint[] := '{}';
    progress boolean;
    skip_groups text[];
    skip_jobs text[] := '{}';
    scope text;
    wake text;
    last text := claim_limited.after;
    ignored text;
    nop boolean;
BEGIN
    ignored := set_config('atlantis.limit_wake', '', true);
    FOREACH q IN ARRAY claim_limited.queues LOOP
        EXIT WHEN cardinality(claimed) >= claim_limited.n;
        SELECT x.priority INTO p FROM atlantis.jobs x
         WHERE x.state = 'available' AND x.limit_group IS NOT NULL AND x.queue = q
         ORDER BY x.priority, x.limit_group LIMIT 1;
        <<priorities>>
        WHILE p IS NOT NULL AND cardinality(claimed) < claim_limited.n LOOP
            groups := ARRAY(
                WITH RECURSIVE r(g, k) AS (
                    -- Two probes, one of which runs: each seeks its start in the index.
                    SELECT CASE WHEN claim_limited.after IS NULL
                                THEN (SELECT x.limit_group FROM atlantis.jobs x
                                       WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                                         AND x.queue = q AND x.priority = p
                                       ORDER BY x.limit_group LIMIT 1)
                                ELSE (SELECT x.limit_group FROM atlantis.jobs x
                                       WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                                         AND x.queue = q AND x.priority = p
                                         AND x.limit_group > claim_limited.after
                                       ORDER BY x.limit_group LIMIT 1) END, 1
                    UNION ALL
                    SELECT (SELECT x.limit_group FROM atlantis.jobs x
                             WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                               AND x.queue = q AND x.priority = p AND x.limit_group > r.g
                             ORDER BY x.limit_group LIMIT 1), r.k + 1
                      FROM r WHERE r.g IS NOT NULL AND r.k < span
                )
                SELECT r.g FROM r WHERE r.g IS NOT NULL ORDER BY r.k);
            IF cardinality(groups) < span AND claim_limited.after IS NOT NULL THEN
                groups := groups || ARRAY(  -- wrapped around: the groups up to `after`
                    WITH RECURSIVE r(g, k) AS (
                        SELECT (SELECT x.limit_group FROM atlantis.jobs x
                                 WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                                   AND x.queue = q AND x.priority = p
                                 ORDER BY x.limit_group LIMIT 1), 1
                        UNION ALL
                        SELECT (SELECT x.limit_group FROM atlantis.jobs x
                                 WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                                   AND x.queue = q AND x.priority = p AND x.limit_group > r.g
                                 ORDER BY x.limit_group LIMIT 1), r.k + 1
                          FROM r WHERE r.g IS NOT NULL AND r.k < span - cardinality(groups)
                    )
                    SELECT r.g FROM r
                     WHERE r.g IS NOT NULL AND r.g <= claim_limited.after ORDER BY r.k);
            END IF;
            skip_groups := '{}';
            pending := groups;
            progress := false;
            LOOP
                IF cardinality(pending) = 0 THEN  -- a round of the groups is over
                    EXIT WHEN NOT progress;
                    pending := ARRAY(SELECT g FROM unnest(groups) WITH ORDINALITY AS u(g, o)
                                      WHERE NOT g = ANY (skip_groups) ORDER BY o);
                    EXIT WHEN cardinality(pending) = 0;
                    progress := false;
                END IF;
                tried := pending[1:claim_limited.n - cardinality(claimed)];
                pending := pending[cardinality(tried) + 1:];
                last := tried[cardinality(tried)];
                ignored := set_config('atlantis.limit_refused', '', true);
                -- The first due row of each group tried, unless another claim holds it; the
                -- trigger decides, row by row, whether it may run.
                WITH c AS (
                    UPDATE atlantis.jobs j
                       SET state = 'running', attempt = j.attempt + 1,
                           claimed_by = claim_limited.worker,
                           claimed_until = now() + j.heartbeat, started_at = now(),
                           progress_history = '[]'
                      FROM (SELECT h.id, t.g
                              FROM unnest(tried) AS t(g)
                             CROSS JOIN LATERAL (
                                   SELECT x.id FROM atlantis.jobs x
                                    WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                                      AND x.queue = q AND x.priority = p
                                      AND x.limit_group = t.g AND x.run_at <= now()
                                      AND x.job = ANY (claim_limited.jobs)
                                      AND NOT x.job = ANY (skip_jobs)
                                    ORDER BY x.run_at, x.id LIMIT 1
                                      FOR UPDATE SKIP LOCKED) h) pick
                     WHERE j.id = pick.id
                    RETURNING j.id, pick.g
                )
                SELECT coalesce(array_agg(c.id), '{}'), coalesce(array_agg(c.g), '{}')
                  INTO took, won FROM c;
                claimed := claimed || took;
                IF cardinality(took) > 0 THEN
                    progress := true;
                END IF;
                -- Refused, nothing due, or held by a claim under way: not again this call.
                skip_groups := skip_groups || ARRAY(SELECT g FROM unnest(tried) AS t(g)
                                                     WHERE NOT g = ANY (won));
                scope := current_setting('atlantis.limit_refused', true);
                IF scope = 'queue' THEN
                    EXIT priorities;
                ELSIF scope LIKE 'job:%' THEN
                    skip_jobs := skip_jobs || substr(scope, 5);
                END IF;
                EXIT WHEN cardinality(claimed) >= claim_limited.n;
            END LOOP;
            EXIT WHEN cardinality(claimed) >= claim_limited.n;
            IF cardinality(groups) >= span THEN
                -- Groups left untried: the next call (from `last` on) tries them.
                nop := atlantis.limit_refuse('', clock_timestamp());
            END IF;
            SELECT x.priority INTO p FROM atlantis.jobs x
             WHERE x.state = 'available' AND x.limit_group IS NOT NULL AND x.queue = q
               AND x.priority > p
             ORDER BY x.priority, x.limit_group LIMIT 1;
        END LOOP;
    END LOOP;
    RETURN QUERY
    SELECT j.id, j.job, j.queue, j.args::text, j.run, j.attempt, j.max_attempts,
           j.cancel_requested_at IS NOT NULL, extract(epoch FROM j.timeout)::float8,
           extract(epoch FROM j.heartbeat)::float8, extract(epoch FROM j.backoff)::float8,
           now() + j.timeout, j.workflow_id,
           CASE WHEN j.workflow_id IS NULL THEN NULL ELSE atlantis.step_context(j.id)::text END,
           NULL::float8, NULL::text
      FROM atlantis.jobs j
     WHERE j.id = ANY (claimed);
    wake := nullif(current_setting('atlantis.limit_wake', true), '');
    RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int,
                        NULL::int, NULL::boolean, NULL::float8, NULL::float8, NULL::float8,
                        NULL::timestamptz, NULL::bigint, NULL::text,
                        CASE WHEN wake IS NOT NULL THEN greatest(0, extract(epoch FROM
                             wake::timestamptz - clock_timestamp()))::float8 END,
                        last;
END
$$;

-- The limits that apply to job `job_id` now (tide, the console).
CREATE OR REPLACE FUNCTION atlantis.limits_of(job_id bigint)
RETURNS TABLE (key text, kind text, n int, period interval, label text)
LANGUAGE sql STABLE AS $$
    SELECT l.key, l.kind, l.n, l.period, l.label
      FROM atlantis.jobs j
      LEFT JOIN atlantis.job_types t ON t.job = j.job
     CROSS JOIN LATERAL atlantis.row_limits(t, j.queue, j.args) l
     WHERE j.id = limits_of.job_id
     ORDER BY l.key
$$;

-- What holds waiting job `job_id` now, as operators read it; NULL when nothing does (or it
-- is not waiting, or not due).
CREATE OR REPLACE FUNCTION atlantis.limit_hold(job_id bigint) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    j atlantis.jobs;
    decl atlantis.job_types;
    l record;
    ids bigint[];
    cnt bigint;
    frees timestamptz;
    out text[] := '{}';
BEGIN
    SELECT * INTO j FROM atlantis.jobs x WHERE x.id = limit_hold.job_id;
    IF NOT FOUND OR j.state <> 'available' OR j.run_at > now() THEN
        RETURN NULL;
    END IF;
    SELECT t.* INTO decl FROM atlantis.job_types t WHERE t.job = j.job;
    FOR l IN SELECT * FROM atlantis.row_limits(decl, j.queue, j.args) r ORDER BY r.key LOOP
        IF l.kind = 'concurrency' THEN
            ids := ARRAY(SELECT h FROM atlantis.limit_holders(decl, j.queue, l.scope, l.fields, l.val, l.whole) h
                          ORDER BY h);
            IF cardinality(ids) >= l.n THEN
                out := out || format('waiting for a slot of `%s`: %s running', l.label,
                    CASE WHEN cardinality(ids) = 1 THEN 'job ' || ids[1]
                         ELSE 'jobs ' || array_to_string(ids[1:5], ', ')
                              || CASE WHEN cardinality(ids) > 5 THEN ', ...' ELSE '' END END);
            END IF;
        ELSE
            SELECT count(*) INTO cnt FROM atlantis.limit_starts s
             WHERE s.key = l.key AND s.until > clock_timestamp();
            IF cnt >= l.n THEN
                SELECT s.until INTO frees FROM atlantis.limit_starts s
                 WHERE s.key = l.key AND s.until > clock_timestamp()
                 ORDER BY s.until OFFSET cnt - l.n LIMIT 1;
                out := out || format('%s: next start in %ss', l.label,
                    ceil(extract(epoch FROM frees - clock_timestamp()))::bigint);
            END IF;
        END IF;
    END LOOP;
    RETURN nullif(array_to_string(out, '; '), '');
END
$$;

-- A job's limits changed (sync): mark its waiting and running rows anew, so the trigger
-- fires for them and the concurrency counts see them. Returns how many rows changed.
CREATE OR REPLACE FUNCTION atlantis.limit_mark(job_name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    decl atlantis.job_types;
    changed bigint;
BEGIN
    SELECT t.* INTO decl FROM atlantis.job_types t WHERE t.job = job_name;
    UPDATE atlantis.jobs j
       SET limit_group = atlantis.limit_group(decl, j.args, EXISTS (
               SELECT 1 FROM atlantis.queues q WHERE q.name = j.queue AND q.concurrency IS NOT NULL))
     WHERE j.job = job_name AND j.state IN ('available', 'running')
       AND j.limit_group IS DISTINCT FROM atlantis.limit_group(decl, j.args, EXISTS (
               SELECT 1 FROM atlantis.queues q WHERE q.name = j.queue AND q.concurrency IS NOT NULL));
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END
$$;

-- Set (or, with NULL, remove) the concurrency limit of a whole queue. Returns the limit it
-- had. Its waiting rows are marked limited, so that every claimer obeys it; supervisors hear
-- of it at once (NOTIFY atlantis_control) or by their pause poll.
CREATE OR REPLACE FUNCTION atlantis.set_queue_limit(queue text, concurrency int,
                                                    by text DEFAULT current_user) RETURNS int
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    was int;
BEGIN
    IF set_queue_limit.concurrency IS NOT NULL AND set_queue_limit.concurrency < 1 THEN
        RAISE EXCEPTION 'queue %: a concurrency limit must be 1 or more, not %',
            set_queue_limit.queue, set_queue_limit.concurrency USING ERRCODE = 'ATL02';
    END IF;
    SELECT q.concurrency INTO was FROM atlantis.queues q
     WHERE q.name = set_queue_limit.queue FOR UPDATE;
    INSERT INTO atlantis.queues AS q (name, concurrency, limit_by, limit_at)
    VALUES (set_queue_limit.queue, set_queue_limit.concurrency,
            coalesce(set_queue_limit.by, current_user), now())
    ON CONFLICT (name) DO UPDATE
       SET concurrency = excluded.concurrency, limit_by = excluded.limit_by,
           limit_at = excluded.limit_at;
    IF set_queue_limit.concurrency IS NOT NULL THEN
        UPDATE atlantis.jobs j SET limit_group = ''
         WHERE j.queue = set_queue_limit.queue AND j.state = 'available' AND j.limit_group IS NULL;
    ELSIF was IS NOT NULL THEN  -- rows only the queue's limit marked are marked no more
        UPDATE atlantis.jobs j SET limit_group = NULL
         WHERE j.queue = set_queue_limit.queue AND j.state = 'available' AND j.limit_group = ''
           AND atlantis.limit_group((SELECT t FROM atlantis.job_types t WHERE t.job = j.job),
                                    j.args, false) IS NULL;
    END IF;
    PERFORM pg_notify('atlantis_control', json_build_object(
        'op', 'limit', 'queue', set_queue_limit.queue)::text);
    -- A limit raised or removed may let waiting rows run.
    PERFORM pg_notify('atlantis_jobs', set_queue_limit.queue);
    RETURN was;
END
$$;

-- Per queue of `queues`: its queue limit, rows running, running rows of limited jobs (slots
-- in use) and due waiting rows of limited jobs (held by a limit, or about to be claimed;
-- counted up to 10,000).
CREATE OR REPLACE FUNCTION atlantis.limit_usage(queues text[])
RETURNS TABLE (queue text, concurrency int, running bigint, limited_running bigint, held bigint)
LANGUAGE sql STABLE AS $$
    SELECT u.q, qq.concurrency,
           (SELECT count(*) FROM atlantis.jobs j WHERE j.state = 'running' AND j.queue = u.q),
           (SELECT count(*) FROM atlantis.jobs j
             WHERE j.state = 'running' AND j.queue = u.q AND j.limit_group IS NOT NULL),
           (SELECT count(*) FROM (SELECT 1 FROM atlantis.jobs j
                                   WHERE j.state = 'available' AND j.queue = u.q
                                     AND j.limit_group IS NOT NULL AND j.run_at <= now()
                                   LIMIT 10000) h)
      FROM unnest(limit_usage.queues) AS u(q)
      LEFT JOIN atlantis.queues qq ON qq.name = u.q
$$;

-- Rate windows that ended are forgotten (at most `batch` rows a call; the rescue runs it).
CREATE OR REPLACE FUNCTION atlantis.limit_sweep(batch int DEFAULT 1000) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    gone int;
BEGIN
    DELETE FROM atlantis.limit_starts s
     WHERE s.ctid = ANY (ARRAY(SELECT x.ctid FROM atlantis.limit_starts x
                                WHERE x.until < now() - interval '1 second'
                                LIMIT greatest(coalesce(batch, 1000), 1)));
    GET DIAGNOSTICS gone = ROW_COUNT;
    RETURN gone;
END
$$;
