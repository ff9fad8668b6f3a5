-- ---- The scaling signal (issue 37, migration 0034) --------------------------------------
-- atlantis.queue_signal(queue): per queue, what an autoscaler and an alert need, read from
-- the jobs table alone (no supervisor has to run), by atlantis_reader too. The waiting rows
-- of a queue (state `available`) fall into four parts, each row in one:
--   claimable   due now (run_at <= now()) and free to be claimed: no limit applies to it,
--               or its limits have room for it (atlantis.signal_limited);
--   limit_held  due now, but a concurrency or rate limit has no room for it;
--   delayed     waiting for a time (run_at > now()): a later run_at, a retry's backoff;
--   suspended   a durable sleep or wait not over yet (suspended_for set, run_at > now()).
-- A suspended row whose wake time came is due: claimable (its resume is a claim). In a
-- paused queue nothing is claimable and nothing is held by a limit: claimable and
-- limit_held are 0, oldest_claimable_seconds NULL, `paused` true; delayed, suspended and
-- running are counted as elsewhere.
-- Every count is exact up to 1,000 rows (the cap); beyond, an estimate (never below the cap
-- + 1: atlantis.signal_scale), and `exact` is false. So the cost stays flat whatever the
-- backlog: index probes, at most cap + 1 index entries per count and at most 50 groups of
-- limited rows judged, on the indexes the claims use (no index of its own: enqueue and
-- claims pay nothing for it). The functions plan each statement as PL/pgSQL does (generic
-- plans after five calls): none of them holds an `x IS NULL OR` test that a generic plan
-- would turn into a walk of a whole queue.

-- The planner's estimate of the rows of atlantis.jobs (as j) that `filter` keeps (EXPLAIN
-- of it; callers build the filter with format() and %L).
CREATE OR REPLACE FUNCTION atlantis.signal_estimate(filter text) RETURNS bigint
LANGUAGE plpgsql VOLATILE  -- EXPLAIN is not allowed in a stable function
SET search_path = pg_catalog, atlantis
AS $$
DECLARE
    plan jsonb;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT 1 FROM atlantis.jobs j WHERE ' || filter INTO plan;
    RETURN (plan->0->'Plan'->>'Plan Rows')::numeric::bigint;
END
$$;

-- The rows of queue `q`, each count stopped at `cap` + 1 (one range of an index a priority,
-- or a probe): `due`, the waiting rows no limit applies to that are due now
-- (jobs_fetch_free_idx), and `oldest`, the run_at of the oldest of them; `limited`, the due
-- waiting rows of limited jobs (jobs_limited_idx); `later`, every waiting row not due yet
-- (jobs_fetch_idx), of which `suspended` are suspended (jobs_suspended_idx); `running`
-- (jobs_state_queue_idx).
CREATE OR REPLACE FUNCTION atlantis.signal_waiting(q text, cap bigint, OUT due bigint,
                                                   OUT limited bigint, OUT later bigint,
                                                   OUT suspended bigint, OUT running bigint,
                                                   OUT oldest timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, atlantis
AS $$
DECLARE
    p int;
    first timestamptz;
    c bigint;
BEGIN
    due := 0;
    later := 0;
    SELECT j.priority INTO p FROM atlantis.jobs j
     WHERE j.state = 'available' AND j.limit_group IS NULL AND j.queue = q
     ORDER BY j.priority LIMIT 1;
    WHILE p IS NOT NULL LOOP
        SELECT j.run_at INTO first FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.limit_group IS NULL AND j.queue = q AND j.priority = p
         ORDER BY j.run_at LIMIT 1;
        IF first <= now() THEN
            oldest := least(oldest, first);
            IF due <= cap THEN
                SELECT count(*) INTO c FROM (
                    SELECT 1 FROM atlantis.jobs j
                     WHERE j.state = 'available' AND j.limit_group IS NULL AND j.queue = q
                       AND j.priority = p AND j.run_at <= now() LIMIT cap + 1 - due) x;
                due := due + c;
            END IF;
        END IF;
        SELECT j.priority INTO p FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.limit_group IS NULL AND j.queue = q AND j.priority > p
         ORDER BY j.priority LIMIT 1;
    END LOOP;
    SELECT j.priority INTO p FROM atlantis.jobs j
     WHERE j.state = 'available' AND j.queue = q ORDER BY j.priority LIMIT 1;
    WHILE p IS NOT NULL AND later <= cap LOOP
        SELECT count(*) INTO c FROM (
            SELECT 1 FROM atlantis.jobs j
             WHERE j.state = 'available' AND j.queue = q AND j.priority = p
               AND j.run_at > now() LIMIT cap + 1 - later) x;
        later := later + c;
        SELECT j.priority INTO p FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.queue = q AND j.priority > p
         ORDER BY j.priority LIMIT 1;
    END LOOP;
    SELECT count(*) INTO limited FROM (
        SELECT 1 FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.limit_group IS NOT NULL AND j.queue = q
           AND j.run_at <= now() LIMIT cap + 1) x;
    -- `run_at + interval '0'`: no index may seek on it. Else, on statistics that say the
    -- table is nearly empty (a burst just enqueued, not analyzed yet), the plan walks the
    -- queue's waiting rows through jobs_fetch_idx, past every due one (480 ms at 1,000,000),
    -- instead of jobs_suspended_idx (1 ms).
    SELECT count(*) INTO suspended FROM (
        SELECT 1 FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.suspended_for IS NOT NULL AND j.queue = q
           AND j.run_at + interval '0' > now() LIMIT cap + 1) x;
    SELECT count(*) INTO running FROM (
        SELECT 1 FROM atlantis.jobs j WHERE j.state = 'running' AND j.queue = q
         LIMIT cap + 1) x;
END
$$;

-- The counts of atlantis.signal_waiting made whole: those above `cap` are estimated (never
-- below cap + 1), and `exact` is false. Only waiting rows have a run_at still to come or a
-- suspension, so `later` and `suspended` are estimated without a state (a long history of
-- finished rows then weighs nothing); `limited` and `running` with theirs; `due` is what
-- those leave of the queue's waiting rows (the planner's estimate of state and queue, which
-- the statistics jobs_state_queue_stats keep close).
CREATE OR REPLACE FUNCTION atlantis.signal_scale(q text, cap bigint, INOUT due bigint,
                                                 INOUT limited bigint, INOUT later bigint,
                                                 INOUT suspended bigint, INOUT running bigint,
                                                 OUT exact boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, atlantis
AS $$
DECLARE
    f text := format('j.queue = %L', q);
BEGIN
    exact := due <= cap AND limited <= cap AND later <= cap AND running <= cap;
    IF running > cap THEN
        running := greatest(cap + 1, atlantis.signal_estimate(f || ' AND j.state = ''running'''));
    END IF;
    IF later > cap THEN
        later := greatest(cap + 1, atlantis.signal_estimate(f || ' AND j.run_at > now()'));
    END IF;
    IF suspended > cap THEN
        suspended := least(later, greatest(cap + 1, atlantis.signal_estimate(
            f || ' AND j.suspended_for IS NOT NULL')));
    END IF;
    IF limited > cap THEN
        limited := greatest(cap + 1, atlantis.signal_estimate(
            f || ' AND j.state = ''available'' AND j.limit_group IS NOT NULL'
              || ' AND j.run_at <= now()'));
    END IF;
    IF due > cap THEN
        due := greatest(cap + 1, atlantis.signal_estimate(f || ' AND j.state = ''available''')
                                 - later - limited);
    END IF;
END
$$;

-- The room the limits of a row of job `job_name` on queue `q` with `args` leave now: the
-- fewest further rows any of them lets start, after the rows `taken` (by limit key: rows
-- this call judged claimable already) are set aside; NULL when no limit applies. `keys`:
-- the limits' keys, for the caller's `taken`. The running rows a concurrency limit counts
-- are counted as the trigger atlantis.limit_claim counts them: `in_queue`, the queue's (a
-- queue limit); `running`, by job and limit_group (a limit whose `by` fields make the
-- group); else atlantis.limit_holders. A rate: its starts in the window.
CREATE OR REPLACE FUNCTION atlantis.signal_room(job_name text, q text, args jsonb,
                                                taken jsonb, running jsonb, in_queue bigint,
                                                OUT room bigint, OUT keys text[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, atlantis
AS $$
DECLARE
    decl atlantis.job_types;
    l record;
    free bigint;
BEGIN
    keys := '{}';
    SELECT t.* INTO decl FROM atlantis.job_types t WHERE t.job = job_name;
    FOR l IN SELECT * FROM atlantis.row_limits(decl, q, args) LOOP
        IF l.kind = 'rate' THEN
            SELECT l.n - count(*) INTO free FROM atlantis.limit_starts s
             WHERE s.key = l.key AND s.until > clock_timestamp();
        ELSIF l.scope = 'queue' THEN
            free := l.n - in_queue;
        ELSIF l.whole THEN
            free := l.n - coalesce((running->>(job_name || ' ' || CASE WHEN l.scope = 'job'
                THEN '' ELSE atlantis.key_digest(l.val::text) END))::bigint, 0);
        ELSE
            SELECT l.n - count(*) INTO free
              FROM atlantis.limit_holders(decl, q, l.scope, l.fields, l.val, false);
        END IF;
        free := greatest(free - coalesce((taken->>l.key)::bigint, 0), 0);
        room := least(room, free);
        keys := keys || l.key;
    END LOOP;
END
$$;

-- The `total` due rows of limited jobs of queue `q` (jobs.limit_group set) split into
-- `claimable` and `held`. Each group of them (a priority and a limit_group, in the order
-- of jobs_limited_idx) is judged by its first due row, as atlantis.claim_groups judges it:
-- its limits' room (atlantis.signal_room; a limit several groups share is counted once)
-- lets that many of the group's due rows be claimed (counted up to the room: a held group
-- costs no count); `oldest`: the run_at of the oldest claimable one. The rest of `total`
-- is held. At most `span` groups are judged. Beyond them (`exact` false), the groups left
-- at the priority reached are estimated from how much of the digests' range (limit_group
-- is a sha256 in hex: spread evenly) the judged ones covered, and each is given the judged
-- groups' mean of claimable rows; the groups of later priorities count as held. `total`:
-- exact up to `cap`, else an estimate (then `exact` is false too).
CREATE OR REPLACE FUNCTION atlantis.signal_limited(q text, cap bigint, span int, total bigint,
                                                   OUT claimable bigint, OUT held bigint,
                                                   OUT oldest timestamptz, OUT exact boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, atlantis
AS $$
DECLARE
    p int;
    last int;
    g text;
    groups text[] := '{}';
    judged int := 0;
    r record;
    lim record;
    take bigint;
    taken jsonb := '{}';
    running jsonb;
    in_queue bigint;
    covered float8;
BEGIN
    claimable := 0;
    held := 0;
    exact := total <= cap;
    IF total = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(jsonb_object_agg(x.job || ' ' || x.limit_group, x.n), '{}') INTO running
      FROM (SELECT j.job, j.limit_group, count(*) AS n FROM atlantis.jobs j
             WHERE j.state = 'running' AND j.limit_group IS NOT NULL GROUP BY 1, 2) x;
    SELECT count(*) INTO in_queue FROM atlantis.jobs j WHERE j.state = 'running' AND j.queue = q;
    SELECT x.priority INTO p FROM atlantis.jobs x
     WHERE x.state = 'available' AND x.limit_group IS NOT NULL AND x.queue = q
     ORDER BY x.priority LIMIT 1;
    WHILE p IS NOT NULL AND judged < span LOOP
        last := p;
        groups := atlantis.limited_groups(q, p, NULL, span - judged);
        judged := judged + cardinality(groups);
        FOREACH g IN ARRAY groups LOOP
            SELECT x.job, x.args, x.run_at INTO r FROM atlantis.jobs x
             WHERE x.state = 'available' AND x.limit_group IS NOT NULL AND x.queue = q
               AND x.priority = p AND x.limit_group = g AND x.run_at <= now()
             ORDER BY x.run_at, x.id LIMIT 1;
            CONTINUE WHEN NOT FOUND;
            SELECT * INTO lim FROM atlantis.signal_room(r.job, q, r.args, taken, running, in_queue);
            take := 0;
            IF coalesce(lim.room, 1) > 0 THEN
                SELECT count(*) INTO take FROM (
                    SELECT 1 FROM atlantis.jobs x
                     WHERE x.state = 'available' AND x.limit_group IS NOT NULL AND x.queue = q
                       AND x.priority = p AND x.limit_group = g AND x.run_at <= now()
                     LIMIT least(coalesce(lim.room, cap + 1), cap + 1)) c;
                oldest := least(oldest, r.run_at);
            END IF;
            taken := taken || coalesce((  -- each key's rows judged claimable, this one's added
                SELECT jsonb_object_agg(k, coalesce((taken->>k)::bigint, 0) + take)
                  FROM unnest(lim.keys) k), '{}');
            claimable := claimable + take;
        END LOOP;
        SELECT x.priority INTO p FROM atlantis.jobs x  -- not NULL: no plan of an OR
         WHERE x.state = 'available' AND x.limit_group IS NOT NULL AND x.queue = q
           AND x.priority > p ORDER BY x.priority LIMIT 1;
    END LOOP;
    IF judged >= span AND cardinality(groups) > 0 THEN  -- more groups at priority `last`?
        g := groups[cardinality(groups)];
        IF EXISTS (SELECT 1 FROM atlantis.jobs x WHERE x.state = 'available' AND x.queue = q
                   AND x.limit_group IS NOT NULL AND x.priority = last AND x.limit_group > g) THEN
            exact := false;
            covered := CASE WHEN g ~ '^[0-9a-f]{13}'
                            THEN ('x' || substr(g, 1, 13))::bit(52)::bigint / 2.0 ^ 52 END;
            IF covered > 0 THEN
                claimable := claimable + round(claimable::numeric / judged
                             * greatest(cardinality(groups) / covered - cardinality(groups), 0));
            END IF;
        END IF;
    END IF;
    exact := exact AND p IS NULL;  -- the groups of a priority not reached: held
    claimable := least(claimable, total);
    held := total - claimable;
END
$$;

-- The queues atlantis.queue_signal(NULL) reports, by name: every queue a declaration, an
-- operator's pause or limit, a live supervisor or a waiting or running row names (the rows'
-- by a loose index scan of jobs_state_queue_idx: one probe per queue).
CREATE OR REPLACE FUNCTION atlantis.signal_queues() RETURNS text[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, atlantis
AS $$
    WITH RECURSIVE walk(state, q) AS (
        SELECT s.state, (SELECT j.queue FROM atlantis.jobs j WHERE j.state = s.state
                          ORDER BY j.queue LIMIT 1)
          FROM unnest(ARRAY['available', 'running']) AS s(state)
        UNION ALL
        SELECT w.state, (SELECT j.queue FROM atlantis.jobs j WHERE j.state = w.state
                          AND j.queue > w.q ORDER BY j.queue LIMIT 1)
          FROM walk w WHERE w.q IS NOT NULL
    )
    SELECT coalesce(array_agg(n.name ORDER BY n.name), '{}') FROM (
        SELECT w.q AS name FROM walk w WHERE w.q IS NOT NULL
        UNION SELECT t.queue FROM atlantis.job_types t
        UNION SELECT x.name FROM atlantis.queues x
        UNION SELECT unnest(w.queues) FROM atlantis.workers w WHERE w.expires_at > now()
    ) n
$$;

-- Per queue (`queue`; NULL: every queue atlantis.signal_queues names, by name), the scaling
-- signal described at the top of this file. A queue nothing names gets its row of zeros:
-- the signal of a queue with nothing to do, never an error (a scaler asks before the first
-- job is enqueued). oldest_claimable_seconds: how long the oldest claimable row has been
-- due (now() - its run_at), NULL when none is claimable.
CREATE OR REPLACE FUNCTION atlantis.queue_signal(queue text DEFAULT NULL)
RETURNS SETOF atlantis.queue_signal_row
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, atlantis
AS $$
DECLARE
    cap constant bigint := 1000;
    span constant int := 50;  -- groups of limited rows judged per queue
    q text;
    r atlantis.queue_signal_row;
    w record;
    c record;
    l record;
BEGIN
    FOREACH q IN ARRAY CASE WHEN queue_signal.queue IS NULL THEN atlantis.signal_queues()
                            ELSE ARRAY[queue_signal.queue] END LOOP
        r.queue := q;
        r.paused := coalesce((SELECT x.paused FROM atlantis.queues x WHERE x.name = q), false);
        SELECT * INTO w FROM atlantis.signal_waiting(q, cap);
        SELECT * INTO c FROM atlantis.signal_scale(q, cap, w.due, w.limited, w.later,
                                                   w.suspended, w.running);
        r.running := c.running;
        r.suspended := c.suspended;
        r.delayed := greatest(c.later - c.suspended, 0);
        r.exact := c.exact;
        r.claimable := 0;
        r.limit_held := 0;
        r.oldest_claimable_seconds := NULL;
        IF NOT r.paused THEN
            SELECT * INTO l FROM atlantis.signal_limited(q, cap, span, c.limited);
            r.claimable := c.due + l.claimable;
            r.limit_held := l.held;
            r.oldest_claimable_seconds := extract(epoch FROM now() - least(w.oldest, l.oldest));
            r.exact := r.exact AND l.exact;
        END IF;
        RETURN NEXT r;
    END LOOP;
END
$$;
