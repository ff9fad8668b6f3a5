-- Liveness (issue 36): a supervisor marks its worker row alive every liveness interval of
-- its own (`--liveness-interval`, 5 s by default), whatever its jobs' heartbeats; a row not
-- refreshed for two of its intervals is "silent" (now() - seen_at > 2 * liveness_interval,
-- the database's clock). A supervisor that starts on the same host rescues at once the rows
-- of one that is provably gone (atlantis.rescue_gone, live/liveness.sql). Additive: a
-- supervisor one release behind writes neither column (NULL: silent once its row expired).

-- Seconds between two marks of life of this supervisor (NULL: a release one behind).
ALTER TABLE atlantis.workers ADD COLUMN liveness_interval float8;
-- /proc/sys/kernel/random/boot_id of its host: with `host`, which boot of which machine
-- the supervisor runs on (NULL: a release one behind, or no /proc).
ALTER TABLE atlantis.workers ADD COLUMN boot_id text;

CREATE FUNCTION atlantis.rescue_gone(worker text, rescuer text, max_backoff float8)
RETURNS TABLE (id bigint, state text, queue text)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text, NULL::text WHERE false $$;
-- The rescue's rule, once: the rescue statement and atlantis.rescue_gone both apply it.
CREATE FUNCTION atlantis.rescue_rows(ids bigint[], rescuer text, max_backoff float8,
                                     gone boolean)
RETURNS TABLE (id bigint, state text, queue text)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text, NULL::text WHERE false $$;
CREATE FUNCTION atlantis.rescue_message(worker text, gone boolean) RETURNS text
LANGUAGE sql AS $$ SELECT NULL::text $$;
