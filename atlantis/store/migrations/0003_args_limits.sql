-- atlantis schema, version 3: arguments every reader can decode.
--
-- A job's args are decoded again in every attempt (in the child, by Python). Enqueue now
-- refuses, with SQLSTATE ATL02 naming the job and the field, what no reader could decode:
--   * jsonb nested more than 64 levels deep (a jsonb field, or an element of a jsonb[]);
--   * a JSON number whose text (as PostgreSQL writes it) is longer than 4000 characters,
--     in a number-typed field or anywhere inside a jsonb value (Python refuses to read
--     integers of more than 4300 digits).
--   * a double outside the range of a double precision float.
-- Only jsonb values are walked, and numbers are measured only when the args are long enough
-- to hold one past the limit; in small args a field that is not jsonb costs one test more.

-- Depth of a jsonb value: 0 for a scalar, 1 + the depth of its deepest member for an
-- array or object (so `[]` is 1 and `{"a": [1]}` is 2).
CREATE FUNCTION atlantis.jsonb_depth(v jsonb) RETURNS int
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

-- Why one value (a field, or an element of an array field) of type `ftype` is past the
-- limits, or NULL. `scan` false says the whole args are too short to hold a number longer
-- than the limit: then only a jsonb container is looked at (for its depth).
CREATE FUNCTION atlantis.limit_mismatch(ftype text, v jsonb, scan boolean) RETURNS text
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

-- Validate one value against a declared scalar type; returns the reason it does not fit,
-- or NULL when it fits. Version 1 plus the range of double; the limits on length and depth
-- are atlantis.limit_mismatch's, checked first.
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
-- Raises SQLSTATE ATL02 naming the job and the field. Version 1 plus the limits.
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
    limit_bytes int := coalesce(nullif(current_setting('atlantis.max_args_bytes', true), '')::int,
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
