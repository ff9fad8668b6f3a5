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

-- The cap on the size of a job's args, in bytes: atlantis.settings' max_args_bytes (only the
-- schema's owner may change it, unlike a GUC any session could raise with SET), else 1 MiB.
CREATE OR REPLACE FUNCTION atlantis.max_args_bytes() RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif((SELECT s.value FROM atlantis.settings s
                             WHERE s.name = 'max_args_bytes'), '')::int, 1048576)
$$;

-- Check one field's value `v` (its declared default when the args lack it) against its
-- declaration: a whole array element by element when `is_array`. `scan`: whether the value
-- could hold a number longer than the limit (atlantis.limit_mismatch then looks at it, as it
-- does at every jsonb value). Raises ATL02 naming the job, the field and the element.
CREATE OR REPLACE FUNCTION atlantis.check_field(job text, fname text, ftype text, flen int,
                                                is_array boolean, v jsonb, scan boolean)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    limits boolean := scan OR ftype = 'jsonb';
    why text;
    elem jsonb;
    i int := 0;
BEGIN
    IF NOT coalesce(is_array, false) OR jsonb_typeof(v) = 'null' THEN
        IF limits THEN
            why := atlantis.limit_mismatch(ftype, v, scan);
        END IF;
        why := coalesce(why, atlantis.type_mismatch(ftype, flen, v));
        IF why IS NOT NULL THEN
            RAISE EXCEPTION 'job %: field %: %', job, fname, why USING ERRCODE = 'ATL02';
        END IF;
        RETURN;
    END IF;
    IF jsonb_typeof(v) <> 'array' THEN
        RAISE EXCEPTION 'job %: field %: expected an array, got %', job, fname,
            jsonb_typeof(v) USING ERRCODE = 'ATL02';
    END IF;
    FOR elem IN SELECT * FROM jsonb_array_elements(v) LOOP
        why := NULL;
        IF limits THEN
            why := atlantis.limit_mismatch(ftype, elem, scan);
        END IF;
        why := coalesce(why, atlantis.type_mismatch(ftype, flen, elem));
        IF why IS NOT NULL THEN
            RAISE EXCEPTION 'job %: field %[%]: %', job, fname, i, why USING ERRCODE = 'ATL02';
        END IF;
        i := i + 1;
    END LOOP;
END
$$;

-- Check `args` against the declaration of `decl`; returns the args with defaults filled in.
-- Raises SQLSTATE ATL02 naming the job and the field. The size cap is
-- atlantis.max_args_bytes; each field is atlantis.check_field's; the limits on numbers and depth are atlantis.limit_mismatch's.
CREATE OR REPLACE FUNCTION atlantis.check_args(decl atlantis.job_types, args jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f jsonb;
    fname text;
    ftype text;
    flen int;
    v jsonb;
    out jsonb := '{}';
    limit_bytes int := atlantis.max_args_bytes();
    args_text text;
    args_bytes int;
    -- Could a number inside a jsonb value be longer than 4000 characters? Not unless the
    -- args are longer than that and hold a run of 255 digits somewhere (such a number has
    -- a run of at least 1999); walking every number costs far more than these two tests.
    long_numbers boolean;
    scan boolean;     -- could this value hold a number longer than the limit?
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
        IF jsonb_typeof(v) = 'null' AND (f->>'not_null')::boolean THEN
            RAISE EXCEPTION 'job %: field % is required (declared not null)', decl.job, fname
                USING ERRCODE = 'ATL02';
        END IF;
        PERFORM atlantis.check_field(decl.job, fname, ftype, flen, (f->>'array')::boolean, v,
                                     scan);
        out := out || jsonb_build_object(fname, v);
    END LOOP;
    RETURN out;
END
$$;

-- The check of atlantis.fast_checked_args for one scalar value `v` (an SQL expression of
-- the row's jsonb value) of type `ftype`, as SQL text; NULL for a type it does not know
-- (check_args then decides). Every name and value in it is quoted (format %L, %s of
-- expressions built here).
CREATE OR REPLACE FUNCTION atlantis.fast_field_check(ftype text, flen int, v text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE ftype
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
    limit_bytes int := atlantis.max_args_bytes();
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
            typed := atlantis.fast_field_check(ftype, flen, v);
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
