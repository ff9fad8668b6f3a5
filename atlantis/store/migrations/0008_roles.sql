-- atlantis schema, version 8: least privilege.
--
-- * Limits live in atlantis.settings, which only the schema's owner may write; the args size
--   cap (`max_args_bytes`, default 1 MiB) is no longer read from the GUC
--   atlantis.max_args_bytes, which any session could raise with SET.
-- * The functions callers use (enqueue, enqueue_many, cancel, retry, pause, resume, prune,
--   schedule_fire, and delete_finished below) run as the schema's owner (SECURITY DEFINER)
--   with a fixed search_path, so that a role may be given them without any right on the
--   tables. Every body qualifies atlantis names; pg_temp comes last so that no temporary
--   object can stand in for a table or a type.
-- * PUBLIC loses every right on the schema, its tables, sequences and functions.
--
-- The roles (atlantis_enqueuer, atlantis_worker, atlantis_operator, atlantis_reader) are
-- cluster-wide: atlantis.store.migrate creates them after the migrations when the migrating
-- role may (superuser or CREATEROLE), and grants them their rights in this database;
-- `tide db roles --sql` prints the same statements.

CREATE TABLE atlantis.settings (
    name  text PRIMARY KEY,
    value text,
    CONSTRAINT settings_max_args_bytes_check
        CHECK (name <> 'max_args_bytes' OR value IS NULL OR value ~ '^[0-9]{1,9}$')
);
INSERT INTO atlantis.settings (name, value) VALUES ('max_args_bytes', '1048576')
ON CONFLICT (name) DO NOTHING;

-- Check `args` against the declaration of `decl`; returns the args with defaults filled in.
-- Raises SQLSTATE ATL02 naming the job and the field. Version 3, with the size cap read
-- from atlantis.settings.
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

-- Delete finished jobs by id, with their attempts and logs (the console's delete, for a role
-- without table rights); returns how many jobs went. Waiting and running jobs are never
-- deleted.
CREATE FUNCTION atlantis.delete_finished(ids bigint[]) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
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

ALTER FUNCTION atlantis.enqueue_many(text, jsonb[], timestamptz, int, text, interval)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.enqueue(text, jsonb, timestamptz, int, text, interval)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.cancel(bigint, text)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.retry(bigint, text)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.pause(text, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.resume(text, text)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.prune(interval, text[], int)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.schedule_fire(text, timestamptz, interval)
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;
ALTER FUNCTION atlantis.delete_finished(bigint[])
    SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp;

REVOKE ALL ON SCHEMA atlantis FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA atlantis FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA atlantis FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA atlantis FROM PUBLIC;
