-- What the live definitions (atlantis/store/live/*.sql: every function and view) were last
-- applied from (issue 32). Migrate applies them again only when their text, the schema
-- version or what the database holds of them changed, and never over a newer package's.
CREATE TABLE atlantis.live_definitions (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),  -- one row
    checksum text NOT NULL,         -- sha256 of the files' text, in the order applied
    schema_version int NOT NULL,    -- the highest migration of the package that applied them
    package_version text NOT NULL,  -- that package's version
    fingerprint text NOT NULL,      -- md5 of what the database held of them right after
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- The named helpers the longest functions were split into (issue 32: no function over 80
-- lines), with placeholder bodies: atlantis/store/live defines them.
CREATE FUNCTION atlantis.max_args_bytes() RETURNS int
LANGUAGE sql STABLE AS $$ SELECT 1048576 $$;
CREATE FUNCTION atlantis.check_field(job text, fname text, ftype text, flen int,
                                     is_array boolean, v jsonb, scan boolean) RETURNS void
LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION atlantis.fast_field_check(ftype text, flen int, v text) RETURNS text
LANGUAGE sql AS $$ SELECT NULL::text $$;
CREATE FUNCTION atlantis.enqueue_unique(decl atlantis.job_types, a jsonb, q text, prio int,
                                        start_at timestamptz, limited boolean,
                                        trace_context jsonb) RETURNS bigint
LANGUAGE sql AS $$ SELECT NULL::bigint $$;
REVOKE ALL ON FUNCTION atlantis.enqueue_unique(atlantis.job_types, jsonb, text, int,
                                               timestamptz, boolean, jsonb) FROM PUBLIC;
CREATE FUNCTION atlantis.limited_priority(q text, above int) RETURNS int
LANGUAGE sql AS $$ SELECT NULL::int $$;
CREATE FUNCTION atlantis.limited_groups(q text, p int, after text, span int) RETURNS text[]
LANGUAGE sql AS $$ SELECT NULL::text[] $$;
CREATE FUNCTION atlantis.claim_groups(q text, p int, tried text[], worker text, jobs text[],
                                      skip_jobs text[]) RETURNS TABLE (id bigint, g text)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text WHERE false $$;
REVOKE ALL ON FUNCTION atlantis.claim_groups(text, int, text[], text, text[], text[]) FROM PUBLIC;
CREATE FUNCTION atlantis.limited_rows(claimed bigint[], last text)
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               wake_in float8, cursor text)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int,
    NULL::int, NULL::boolean, NULL::float8, NULL::float8, NULL::float8, NULL::timestamptz,
    NULL::bigint, NULL::text, NULL::float8, NULL::text WHERE false $$;
