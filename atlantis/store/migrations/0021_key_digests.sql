-- Keys of any length (issue 31). A `by` or `unique` value may be any value the args accept
-- (up to the args limit, 1 MiB), but a btree entry holds at most 2,704 bytes: a longer key
-- failed the enqueue, a deploy declaring the limit, and every claim of its queue. Every
-- index over a key derived from args now holds the key's digest (atlantis.key_digest,
-- SHA-256 in hex); the readable key stays where people read it (jobs.unique_key,
-- workflow_instances.unique_key, the args, the labels of tide and the console).
--   jobs_unique_idx, workflow_instances_unique_idx: over the digest of unique_key.
--   jobs.limit_group (jobs_limited_idx, jobs_limited_running_idx): holds the digest of the
--     group's values ('' and NULL keep their meaning); rows holding a group are converted.
--   atlantis.limit_starts.key (limit_starts_key_idx): the digest of the limit's key;
--     open windows are converted.
-- The bodies of the new functions live in atlantis/store/live/*.sql; key_digest's is here too, as the
-- indexes need it now (atlantis/store/live/*.sql repeats it, unchanged).

CREATE FUNCTION atlantis.key_digest(key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT encode(sha256(convert_to(key, 'UTF8')), 'hex') $$;
REVOKE ALL ON FUNCTION atlantis.key_digest(text) FROM PUBLIC;

CREATE FUNCTION atlantis.key_text(key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ SELECT key $$;
REVOKE ALL ON FUNCTION atlantis.key_text(text) FROM PUBLIC;

-- A claim that failed on one row's data: that row ends dead (kind `claim`), the queue runs.
CREATE FUNCTION atlantis.claim_isolate(queues text[], jobs text[], worker text, n int,
                                       limited text[], rejected text[])
RETURNS TABLE (id bigint, error text)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text WHERE false $$;
REVOKE ALL ON FUNCTION atlantis.claim_isolate(text[], text[], text, int, text[], text[])
    FROM PUBLIC;

DROP INDEX atlantis.jobs_unique_idx;
CREATE UNIQUE INDEX jobs_unique_idx ON atlantis.jobs (job, atlantis.key_digest(unique_key))
    WHERE unique_key IS NOT NULL AND state IN ('available', 'running');

DROP INDEX atlantis.workflow_instances_unique_idx;
CREATE UNIQUE INDEX workflow_instances_unique_idx
    ON atlantis.workflow_instances (workflow, atlantis.key_digest(unique_key))
    WHERE unique_key IS NOT NULL AND state IN ('running', 'compensating');

-- The groups held so far are the values themselves: their digests from now on. The two
-- indexes over limit_group are rebuilt once rather than updated row by row.
DROP INDEX atlantis.jobs_limited_idx;
DROP INDEX atlantis.jobs_limited_running_idx;
UPDATE atlantis.jobs SET limit_group = atlantis.key_digest(limit_group)
 WHERE limit_group IS NOT NULL AND limit_group <> '';
CREATE INDEX jobs_limited_idx ON atlantis.jobs (queue, priority, limit_group, run_at, id)
    WHERE state = 'available' AND limit_group IS NOT NULL;
CREATE INDEX jobs_limited_running_idx ON atlantis.jobs (job, limit_group)
    WHERE state = 'running' AND limit_group IS NOT NULL;

UPDATE atlantis.limit_starts SET key = atlantis.key_digest(key);
