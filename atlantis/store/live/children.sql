-- ---- Children (issue 35, migration 0028) ------------------------------------------------
-- ctx.spawn enqueues a child job exactly once: the fence, the enqueue and the step's record
-- are one statement, one transaction. ctx.join waits until every listed job has ended. A
-- child's end never writes its parent's row, except the last one its join waits for: the
-- join counts the children's own rows (atlantis.jobs_children_idx), in the transaction that
-- ends each one, and the wake of a parent already woken is a no-op (run_at is not later
-- than now()). SQLSTATE ATL04: a join names a job that does not exist; ATL23: a join past
-- its caps (children, bytes of results); ATL24: a spawn by a job being cancelled.

-- What both spawns do once fenced: a job being cancelled spawns nothing more (its children
-- are being cancelled: ATL24); otherwise `job_name` is enqueued once per element of
-- `args_list` (atlantis.enqueue_many's rules and options) and each row inserted by this
-- transaction is made a child of `job_id` (`fresh`). A `unique` job whose key an existing
-- job holds returns that job, not made a child (its xmin is not ours; no savepoint lies in
-- between). One row per element, in its order.
CREATE OR REPLACE FUNCTION atlantis.spawn_rows(job_id bigint, name text, job_name text,
                                               args_list jsonb[], run_at timestamptz,
                                               priority int, queue text, delay interval,
                                               trace_context jsonb)
RETURNS TABLE (child bigint, fresh boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    ids bigint[];
    adopted bigint[];
BEGIN
    IF EXISTS (SELECT 1 FROM atlantis.jobs x
                WHERE x.id = spawn_rows.job_id AND x.cancel_requested_at IS NOT NULL) THEN
        RAISE EXCEPTION 'spawn %: job % is being cancelled: it spawns no more children',
            spawn_rows.name, spawn_rows.job_id USING ERRCODE = 'ATL24';
    END IF;
    ids := atlantis.enqueue_many(spawn_rows.job_name, spawn_rows.args_list, spawn_rows.run_at,
                                 spawn_rows.priority, spawn_rows.queue, spawn_rows.delay,
                                 spawn_rows.trace_context);
    WITH made AS (
        UPDATE atlantis.jobs x SET parent_id = spawn_rows.job_id
         WHERE x.id = ANY (ids) AND x.parent_id IS NULL AND x.xmin = pg_current_xact_id()::xid
        RETURNING x.id
    )
    SELECT coalesce(array_agg(made.id), '{}') INTO adopted FROM made;
    RETURN QUERY SELECT u.i, u.i = ANY (adopted) FROM unnest(ids) WITH ORDINALITY AS u(i, o)
                  ORDER BY u.o;
END
$$;
REVOKE ALL ON FUNCTION atlantis.spawn_rows(bigint, text, text, jsonb[], timestamptz, int, text,
                                           interval, jsonb) FROM PUBLIC;

-- Spawn: enqueue `job_name` with `args` for the run that holds job `job_id`
-- (atlantis.spawn_rows), and record it as step `name`, `{"job": id, "child": fresh}`.
CREATE OR REPLACE FUNCTION atlantis.step_spawn(job_id bigint, run_id uuid, name text, attempt int,
                                               job_name text, args jsonb, run_at timestamptz,
                                               priority int, queue text, delay interval,
                                               trace_context jsonb)
RETURNS TABLE (child bigint, fresh boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    val jsonb;
BEGIN
    PERFORM atlantis.step_fence(step_spawn.job_id, step_spawn.run_id);
    SELECT r.child, r.fresh INTO child, fresh
      FROM atlantis.spawn_rows(step_spawn.job_id, step_spawn.name, step_spawn.job_name,
                               ARRAY[step_spawn.args], step_spawn.run_at, step_spawn.priority,
                               step_spawn.queue, step_spawn.delay, step_spawn.trace_context) r;
    val := jsonb_build_object('job', child, 'child', fresh);
    INSERT INTO atlantis.job_steps (job_id, name, kind, value, bytes, run_id, attempt)
    VALUES (step_spawn.job_id, step_spawn.name, 'spawn', val, octet_length(val::text),
            step_spawn.run_id, step_spawn.attempt);
    RETURN NEXT;
END
$$;

-- Spawn many: `job_name` once per element of `args_list` (at most 10000) in one statement,
-- as atlantis.step_spawn does for one, recorded once as `{"jobs": [...], "children": n}`;
-- the ids in the order of `args_list`, `fresh` for each new child.
CREATE OR REPLACE FUNCTION atlantis.step_spawn_many(job_id bigint, run_id uuid, name text,
                                                    attempt int, job_name text,
                                                    args_list jsonb[], run_at timestamptz,
                                                    priority int, queue text, delay interval,
                                                    trace_context jsonb)
RETURNS TABLE (child bigint, fresh boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ids bigint[];
    fresh_ones boolean[];
    val jsonb;
BEGIN
    PERFORM atlantis.step_fence(step_spawn_many.job_id, step_spawn_many.run_id);
    IF cardinality(step_spawn_many.args_list) > 10000 THEN
        RAISE EXCEPTION 'spawn %: % jobs, more than the 10000 one spawn_many enqueues',
            step_spawn_many.name, cardinality(step_spawn_many.args_list) USING ERRCODE = 'ATL23';
    END IF;
    SELECT coalesce(array_agg(r.child ORDER BY r.o), '{}'),
           coalesce(array_agg(r.fresh ORDER BY r.o), '{}')
      INTO ids, fresh_ones
      FROM atlantis.spawn_rows(step_spawn_many.job_id, step_spawn_many.name,
                               step_spawn_many.job_name, step_spawn_many.args_list,
                               step_spawn_many.run_at, step_spawn_many.priority,
                               step_spawn_many.queue, step_spawn_many.delay,
                               step_spawn_many.trace_context) WITH ORDINALITY AS r(child, fresh, o);
    val := jsonb_build_object('jobs', to_jsonb(ids),
                              'children', (SELECT count(*) FROM unnest(fresh_ones) f WHERE f));
    INSERT INTO atlantis.job_steps (job_id, name, kind, value, bytes, run_id, attempt)
    VALUES (step_spawn_many.job_id, step_spawn_many.name, 'spawn', val,
            octet_length(val::text), step_spawn_many.run_id, step_spawn_many.attempt);
    RETURN QUERY SELECT u.c, u.f FROM unnest(ids, fresh_ones) AS u(c, f);
END
$$;

-- Join: for the run that holds job `job_id`, the jobs `ids` once every one has ended: a
-- first row (id NULL, state 'ended'), then one row per id in the order given (its end
-- state, its result when `results`, its last error). While some have not ended: one row
-- (id NULL, state 'waiting', error: how many have not). The ids are recorded as step
-- `name` (what atlantis.join_ready and `tide job status` read).
CREATE OR REPLACE FUNCTION atlantis.step_join(job_id bigint, run_id uuid, name text, attempt int,
                                              ids bigint[], results boolean)
RETURNS TABLE (id bigint, state text, result text, error text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    val jsonb := jsonb_build_object('ids', to_jsonb(coalesce(step_join.ids, '{}')));
    missing bigint;
    pending bigint;
    total bigint;
BEGIN
    PERFORM atlantis.step_fence(step_join.job_id, step_join.run_id);
    IF cardinality(step_join.ids) > 100000 THEN
        RAISE EXCEPTION 'join %: % jobs, more than the 100000 a join may wait for',
            step_join.name, cardinality(step_join.ids) USING ERRCODE = 'ATL23';
    END IF;
    SELECT u.i INTO missing FROM unnest(step_join.ids) AS u(i)
     WHERE u.i IS NULL OR NOT EXISTS (SELECT 1 FROM atlantis.jobs x WHERE x.id = u.i) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'join %: no job with id %', step_join.name, coalesce(missing::text, 'null')
            USING ERRCODE = 'ATL04';
    END IF;
    INSERT INTO atlantis.job_steps AS s (job_id, name, kind, value, bytes, run_id, attempt)
    VALUES (step_join.job_id, step_join.name, 'join', val, octet_length(val::text),
            step_join.run_id, step_join.attempt)
    ON CONFLICT (job_id, name) DO UPDATE
       SET value = excluded.value, bytes = excluded.bytes, run_id = excluded.run_id,
           attempt = excluded.attempt, recorded_at = clock_timestamp()
     WHERE s.value IS DISTINCT FROM excluded.value;
    SELECT count(*) FILTER (WHERE x.state IN ('available', 'running')),
           coalesce(sum(octet_length(x.result::text)) FILTER (WHERE step_join.results), 0)
      INTO pending, total
      FROM unnest(step_join.ids) AS u(i) JOIN atlantis.jobs x ON x.id = u.i;
    IF pending > 0 THEN
        RETURN QUERY SELECT NULL::bigint, 'waiting'::text, NULL::text, pending::text;
        RETURN;
    END IF;
    IF total > 16777216 THEN
        RAISE EXCEPTION 'join %: the results of its % jobs are % bytes of JSON, more than the 16777216 a join returns (join with results=False for their end states)',
            step_join.name, cardinality(step_join.ids), total USING ERRCODE = 'ATL23';
    END IF;
    RETURN QUERY SELECT NULL::bigint, 'ended'::text, NULL::text, NULL::text;
    RETURN QUERY
        SELECT x.id, x.state, CASE WHEN step_join.results THEN x.result::text END,
               CASE WHEN x.state <> 'complete' THEN x.last_error END
          FROM unnest(step_join.ids) WITH ORDINALITY AS u(i, o)
          JOIN atlantis.jobs x ON x.id = u.i
         ORDER BY u.o;
END
$$;

-- Whether every job the join `name` of job `job_id` waits for (its record) has ended.
CREATE OR REPLACE FUNCTION atlantis.join_ready(job_id bigint, name text) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, atlantis, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM atlantis.job_steps s
                    WHERE s.job_id = join_ready.job_id AND s.name = join_ready.name
                      AND s.kind = 'join')
       AND NOT EXISTS (
           SELECT 1 FROM atlantis.job_steps s
                   CROSS JOIN LATERAL jsonb_array_elements_text(s.value->'ids') AS e(i)
                   JOIN atlantis.jobs x ON x.id = e.i::bigint
            WHERE s.job_id = join_ready.job_id AND s.name = join_ready.name AND s.kind = 'join'
              AND x.state IN ('available', 'running'))
$$;
REVOKE ALL ON FUNCTION atlantis.join_ready(bigint, text) FROM PUBLIC;

-- Wake the jobs whose join can go on although no child's end woke them: a join over some
-- of a job's children while others still run, or a last child that ended while its parent
-- was suspending, in another transaction. Each supervisor's rescue calls it.
CREATE OR REPLACE FUNCTION atlantis.join_sweep(n int) RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
    WITH due AS (
        SELECT j.id FROM atlantis.jobs j
         WHERE j.state = 'available' AND j.suspended_for LIKE 'join:%' AND j.run_at > now()
           AND atlantis.join_ready(j.id, substr(j.suspended_for, 6))
         LIMIT join_sweep.n
           FOR UPDATE SKIP LOCKED
    ), woke AS (
        UPDATE atlantis.jobs j SET run_at = now() FROM due WHERE j.id = due.id
        RETURNING j.queue
    ), told AS (
        SELECT pg_notify('atlantis_jobs', q.queue) FROM (SELECT DISTINCT queue FROM woke) q
    )
    SELECT (SELECT count(*) FROM woke) + 0 * (SELECT count(*) FROM told)
$$;

-- Trigger jobs_child_end: a child ended; its parent, waiting in a join, is woken when no
-- other child of it is waiting or running.
CREATE OR REPLACE FUNCTION atlantis.child_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    q text;
BEGIN
    UPDATE atlantis.jobs p SET run_at = now()
     WHERE p.id = NEW.parent_id AND p.state = 'available' AND p.suspended_for LIKE 'join:%'
       AND p.run_at > now()
       AND NOT EXISTS (SELECT 1 FROM atlantis.jobs c
                        WHERE c.parent_id = NEW.parent_id AND c.state IN ('available', 'running'))
    RETURNING p.queue INTO q;
    IF q IS NOT NULL THEN
        PERFORM pg_notify('atlantis_jobs', q);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION atlantis.child_ended() FROM PUBLIC;

-- Trigger jobs_cancel_children: a job was cancelled, or a cancel of its running attempt was
-- asked; its waiting and running children are cancelled too (theirs in turn), lowest id
-- first, named as cancelled with their parent.
CREATE OR REPLACE FUNCTION atlantis.cancel_children() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
BEGIN
    PERFORM atlantis.cancel(c.id, coalesce(NEW.cancelled_by, current_user::text)
                                  || ' (with parent job ' || NEW.id || ')')
       FROM atlantis.jobs c
      WHERE c.parent_id = NEW.id AND c.state IN ('available', 'running')
      ORDER BY c.id;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION atlantis.cancel_children() FROM PUBLIC;

-- Trigger jobs_wait_check: a run suspended to wait for an event or a join; when what it
-- waits for is already there, it runs again at once.
CREATE OR REPLACE FUNCTION atlantis.wait_check() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    ready boolean;
BEGIN
    IF NEW.run_at <= now() THEN
        RETURN NULL;
    ELSIF NEW.suspended_for LIKE 'event:%' THEN
        ready := EXISTS (SELECT 1 FROM atlantis.job_events e
                          WHERE e.job_id = NEW.id AND e.consumed_at IS NULL
                            AND e.event = substr(NEW.suspended_for, 7));
    ELSE
        ready := atlantis.join_ready(NEW.id, substr(NEW.suspended_for, 6));
    END IF;
    IF ready THEN
        UPDATE atlantis.jobs x SET run_at = now() WHERE x.id = NEW.id;
        PERFORM pg_notify('atlantis_jobs', NEW.queue);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION atlantis.wait_check() FROM PUBLIC;

-- Whether `parent_id` names a job still waiting or running: its children are kept from
-- atlantis.prune and atlantis.delete_finished until it ends (its join reads them). Plain
-- SQL without settings, so that the planner inlines it in those statements.
CREATE OR REPLACE FUNCTION atlantis.parent_live(parent_id bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT parent_live.parent_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM atlantis.jobs p
         WHERE p.id = parent_live.parent_id AND p.state IN ('available', 'running'))
$$;
REVOKE ALL ON FUNCTION atlantis.parent_live(bigint) FROM PUBLIC;
