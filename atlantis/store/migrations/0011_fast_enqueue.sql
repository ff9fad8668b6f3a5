-- A set-based check of a whole batch of args (enqueue_many): the same rules as
-- atlantis.check_args, compiled from the declaration into one SQL expression and run over
-- every row of the batch in one statement, instead of a PL/pgSQL walk of the declaration per
-- row (which was nearly all of enqueue_many's cost).
--
-- atlantis.fast_checked_args(decl, args_list) returns the args with defaults filled in, in
-- order, when every row passes; NULL when any row does not (or the declaration has
-- something the fast check does not cover). enqueue_many then checks row by row with
-- atlantis.check_args, which raises the error naming the job and the field, exactly as
-- before. The fast check may refuse rows check_args accepts (they are then checked again),
-- never the reverse: it accepts a row only when check_args would, with the same result.
--
-- The expression is built here, from the declaration in atlantis.job_types, with every name
-- and value quoted (format %L); types come from a fixed list; nothing a caller passes is
-- ever spliced into it.

CREATE FUNCTION atlantis.fast_checked_args(decl atlantis.job_types, args_list jsonb[])
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

-- enqueue_many as in 0001, checking a batch of 8 or more rows set-based first.
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
    start_at timestamptz := coalesce(run_at, now() + coalesce(delay, interval '0'));
    ids bigint[];
    checked jsonb[];
    a jsonb;
    i int := 0;
    key text;
    new_id bigint;
BEGIN
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

REVOKE ALL ON FUNCTION atlantis.fast_checked_args(atlantis.job_types, jsonb[]) FROM PUBLIC;
