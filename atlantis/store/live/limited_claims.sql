-- ---- Limits: the claim of limited rows, and what tide and the console ask of limits ---

-- The priority of the first due-or-not waiting limited row of queue `q` above priority
-- `above` (NULL: the highest); NULL when there is none. One probe of jobs_limited_idx.
-- Two probes, one of which runs (as in limited_groups): an `above IS NULL OR priority >
-- above` test would let a generic plan (claim_limited forces them; PostgreSQL 18 caches a
-- SQL function's plans and goes generic after five calls) read every waiting limited row of
-- the priority `above` before it finds none past it: 13 ms at 20,000 such rows, against
-- 0.16 ms for the probe (benchmarks/HISTORY.md, 2026-12-07).
CREATE OR REPLACE FUNCTION atlantis.limited_priority(q text, above int) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN above IS NULL
                THEN (SELECT x.priority FROM atlantis.jobs x
                       WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                         AND x.queue = q
                       ORDER BY x.priority, x.limit_group LIMIT 1)
                ELSE (SELECT x.priority FROM atlantis.jobs x
                       WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                         AND x.queue = q AND x.priority > above
                       ORDER BY x.priority, x.limit_group LIMIT 1) END
$$;

-- Up to `span` groups (limit_group) of waiting limited rows of queue `q` at priority `p`, in
-- turn: the ones after `after` (all from the first when NULL), then, wrapping around, the
-- ones up to `after`. Each is one index probe of jobs_limited_idx (queue, priority,
-- limit_group, ...): a recursive walk, whatever the number of rows a group holds. No sort:
-- a table whose statistics say it is nearly empty (rows just enqueued, not analyzed yet)
-- would otherwise have each probe read the queue's whole priority through jobs_fetch_idx and
-- sort it (2.7 ms a probe at 10,000 rows, against 0.03: the limited drain ran at half speed
-- until autovacuum analyzed the table; benchmarks/HISTORY.md, 2026-12-07).
CREATE OR REPLACE FUNCTION atlantis.limited_groups(q text, p int, after text, span int)
RETURNS text[]
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
AS $$
DECLARE
    groups text[];
BEGIN
    groups := ARRAY(
        WITH RECURSIVE r(g, k) AS (
            -- Two probes, one of which runs: each seeks its start in the index.
            SELECT CASE WHEN after IS NULL
                        THEN (SELECT x.limit_group FROM atlantis.jobs x
                               WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                                 AND x.queue = q AND x.priority = p
                               ORDER BY x.limit_group LIMIT 1)
                        ELSE (SELECT x.limit_group FROM atlantis.jobs x
                               WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                                 AND x.queue = q AND x.priority = p AND x.limit_group > after
                               ORDER BY x.limit_group LIMIT 1) END, 1
            UNION ALL
            SELECT (SELECT x.limit_group FROM atlantis.jobs x
                     WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                       AND x.queue = q AND x.priority = p AND x.limit_group > r.g
                     ORDER BY x.limit_group LIMIT 1), r.k + 1
              FROM r WHERE r.g IS NOT NULL AND r.k < span
        )
        SELECT r.g FROM r WHERE r.g IS NOT NULL ORDER BY r.k);
    IF cardinality(groups) < span AND after IS NOT NULL THEN
        groups := groups || ARRAY(  -- wrapped around: the groups up to `after`
            SELECT g FROM unnest(atlantis.limited_groups(q, p, NULL, span - cardinality(groups)))
                          WITH ORDINALITY AS u(g, o)
             WHERE g <= after ORDER BY o);
    END IF;
    RETURN groups;
END
$$;

-- Claim the first due row of each group of `tried` (queue `q`, priority `p`, one of `jobs`,
-- none of `skip_jobs`) for `worker`, unless another claim holds it; the trigger
-- jobs_limit_claim decides, row by row, whether it may run. Returns the rows claimed, with
-- their group. Each group's row is one seek in jobs_limited_idx, whatever the statistics:
-- the group is matched as a range of one value and its rows ordered by it too, which no
-- other index gives without a sort, and sorts are off. With `limit_group = g` a generic
-- plan on a table whose statistics say it is nearly empty (a burst just enqueued) walked
-- jobs_fetch_idx from the queue's head instead, reading every waiting row of the other
-- groups before it (0.44 ms a call in a limited drain; benchmarks/HISTORY.md, 2026-12-07).
CREATE OR REPLACE FUNCTION atlantis.claim_groups(q text, p int, tried text[], worker text,
                                                 jobs text[], skip_jobs text[])
RETURNS TABLE (id bigint, g text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE atlantis.jobs j
       SET state = 'running', attempt = j.attempt + 1, claimed_by = claim_groups.worker,
           claimed_until = now() + j.heartbeat, started_at = now(), progress_history = '[]',
           run_id = gen_random_uuid(), suspended_for = NULL
      FROM (SELECT h.id, t.g
              FROM unnest(claim_groups.tried) AS t(g)
             CROSS JOIN LATERAL (
                   SELECT x.id FROM atlantis.jobs x
                    WHERE x.state = 'available' AND x.limit_group IS NOT NULL
                      AND x.queue = claim_groups.q AND x.priority = claim_groups.p
                      AND x.limit_group >= t.g AND x.limit_group <= t.g AND x.run_at <= now()
                      AND x.job = ANY (claim_groups.jobs) AND NOT x.job = ANY (claim_groups.skip_jobs)
                    ORDER BY x.limit_group, x.run_at, x.id LIMIT 1
                      FOR UPDATE SKIP LOCKED) h) pick
     WHERE j.id = pick.id
    RETURNING j.id, pick.g;
END
$$;
REVOKE ALL ON FUNCTION atlantis.claim_groups(text, int, text[], text, text[], text[]) FROM PUBLIC;

-- What atlantis.claim_limited returns: the rows `claimed` as the `claim` query returns them,
-- then the hint row (a NULL id): `wake_in`, in how many seconds to claim again (the earliest
-- time atlantis.limit_refuse recorded in this transaction; NULL: nothing to wait for), and
-- `cursor`, the last group tried.
CREATE OR REPLACE FUNCTION atlantis.limited_rows(claimed bigint[], last text)
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               wake_in float8, cursor text)
LANGUAGE sql VOLATILE AS $$
    SELECT j.id, j.job, j.queue, j.args::text, j.run, j.attempt, j.max_attempts,
           j.cancel_requested_at IS NOT NULL, extract(epoch FROM j.timeout)::float8,
           extract(epoch FROM j.heartbeat)::float8, extract(epoch FROM j.backoff)::float8,
           now() + j.timeout, j.workflow_id,
           CASE WHEN j.workflow_id IS NULL THEN NULL ELSE atlantis.step_context(j.id)::text END,
           NULL::float8, NULL::text
      FROM atlantis.jobs j
     WHERE j.id = ANY (claimed)
    UNION ALL
    SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int, NULL::int,
           NULL::boolean, NULL::float8, NULL::float8, NULL::float8, NULL::timestamptz,
           NULL::bigint, NULL::text,
           CASE WHEN w.wake IS NOT NULL THEN greatest(0, extract(epoch FROM
                w.wake::timestamptz - clock_timestamp()))::float8 END,
           last
      FROM (SELECT nullif(current_setting('atlantis.limit_wake', true), '') AS wake) w
$$;

-- Claim up to `n` due rows of limited jobs (jobs.limit_group set) of `jobs` on `queues`, for
-- idle children only (never ahead). Priority first. Within a priority the groups take turns:
-- at most `span` groups a priority and call (atlantis.limited_groups), starting after `after`
-- (the last group the previous call tried: the groups rotate across calls, whatever their
-- number) and wrapping around; each statement then claims the first due row of as many
-- untried groups as rows are wanted (atlantis.claim_groups), the trigger deciding for each,
-- until enough are claimed; a round of the groups that claimed something starts again from
-- the first for their next rows. A group whose row was refused is skipped for the rest of
-- the call, as are the job and the queue when the refusal was theirs
-- (atlantis.limit_refuse): no row waits behind a full limit.
-- Returns the claimed rows as the `claim` query does, then one row with a NULL id:
-- `wake_in`, in how many seconds to claim again (a rate window frees, a key's lock was
-- taken, or groups were left untried; NULL: nothing to wait for), and `cursor`, the `after`
-- of the next call. The caller reads the columns by name.
CREATE OR REPLACE FUNCTION atlantis.claim_limited(queues text[], jobs text[], worker text, n int,
                                                  after text DEFAULT NULL)
RETURNS TABLE (id bigint, job text, queue text, args text, run int, attempt int,
               max_attempts int, cancel_requested boolean, timeout float8, heartbeat float8,
               backoff float8, deadline timestamptz, workflow_id bigint, workflow text,
               wake_in float8, cursor text, run_id uuid)
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
    took bigint[];
    won text[];
    claimed bigint[] := '{}';
    progress boolean;
    skip_groups text[];
    skip_jobs text[] := '{}';
    scope text;
    last text := claim_limited.after;
BEGIN
    PERFORM set_config('atlantis.limit_wake', '', true);
    FOREACH q IN ARRAY claim_limited.queues LOOP
        EXIT WHEN cardinality(claimed) >= claim_limited.n;
        p := atlantis.limited_priority(q, NULL);
        <<priorities>>
        WHILE p IS NOT NULL AND cardinality(claimed) < claim_limited.n LOOP
            groups := atlantis.limited_groups(q, p, claim_limited.after, span);
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
                PERFORM set_config('atlantis.limit_refused', '', true);
                SELECT coalesce(array_agg(c.id), '{}'), coalesce(array_agg(c.g), '{}')
                  INTO took, won
                  FROM atlantis.claim_groups(q, p, tried, claim_limited.worker,
                                             claim_limited.jobs, skip_jobs) c;
                claimed := claimed || took;
                progress := progress OR cardinality(took) > 0;
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
                PERFORM atlantis.limit_refuse('', clock_timestamp());
            END IF;
            p := atlantis.limited_priority(q, p);
        END LOOP;
    END LOOP;
    -- The run id (migration 0026) beside limited_rows' columns, whose type is older.
    RETURN QUERY SELECT l.*, (SELECT j.run_id FROM atlantis.jobs j WHERE j.id = l.id)
                   FROM atlantis.limited_rows(claimed, last) AS l;
END
$$;

-- The limits that apply to job `job_id` now: for SQL callers (granted to atlantis_reader with
-- the other read functions, atlantis/store/migrate.py); tide and the console ask limit_hold.
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

-- Whether a claim is still in time, called by the claim and claim_limited queries once the
-- claim is made and before the statement's implicit COMMIT: past `deadline` it raises
-- query_canceled, and the whole claim rolls back. The claimer sends claims without
-- BEGIN ... COMMIT, so it
-- cannot withhold the COMMIT of an answer that comes too late; the database refuses to
-- commit a claim that ran past half the claimer's wait instead ("a late claim never starts"):
-- an answer still lost on its way after a COMMIT is given back unspent by the claimer's
-- release of orphans, as a lost COMMIT's always was.
CREATE OR REPLACE FUNCTION atlantis.claim_in_time(deadline timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF clock_timestamp() > claim_in_time.deadline THEN
        RAISE EXCEPTION 'the claim ran past its deadline (%)', claim_in_time.deadline
              USING ERRCODE = 'query_canceled';
    END IF;
    RETURN true;
END;
$$;
