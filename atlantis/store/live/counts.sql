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
