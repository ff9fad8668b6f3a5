-- ---- Operators' orders to one supervisor (issue 37, migration 0032) -----------------------
-- `tide worker drain|evict ID` and the console write a row of atlantis.worker_orders, keyed
-- by the supervisor's name, and NOTIFY it on atlantis_control ({"op": "worker"}); the
-- supervisor also reads its order every --pause-poll (a lost NOTIFY) and at start (a
-- restarted supervisor adopts its name's order and starts drained). What it does then is
-- atlantis/supervisor/orders.py's. An order to a silent supervisor is recorded all the same:
-- it is obeyed if it wakes, and its leases still rule meanwhile (nothing is released early).

-- Order the supervisor `worker` (its id, or its name) to drain or be evicted. `by` is who
-- asked. Returns the supervisor's row as the order found it. Refused (ATL30) for an unknown
-- supervisor, for one of a release that takes no orders, and for an unknown action.
CREATE OR REPLACE FUNCTION atlantis.order_worker(worker text, action text,
                                                 exit_when_drained boolean, by text)
RETURNS TABLE (id text, name text, silent boolean, in_flight int)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    w atlantis.workers;
BEGIN
    IF order_worker.action IS NULL OR order_worker.action NOT IN ('drain', 'evict') THEN
        RAISE EXCEPTION 'unknown order %: drain or evict', coalesce(order_worker.action, 'NULL')
              USING ERRCODE = 'ATL30';
    END IF;
    SELECT * INTO w FROM atlantis.workers x
     WHERE x.id = order_worker.worker OR x.name = order_worker.worker
     ORDER BY x.id = order_worker.worker DESC, x.started_at DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no supervisor %', order_worker.worker
              USING ERRCODE = 'ATL30',
                    HINT = 'tide worker list shows the live and silent ones';
    END IF;
    IF w.name IS NULL THEN
        RAISE EXCEPTION 'supervisor % runs a release that takes no orders: stop it instead', w.id
              USING ERRCODE = 'ATL30';
    END IF;
    INSERT INTO atlantis.worker_orders AS o (name, worker_id, action, exit_when_drained,
                                             asked_by, asked_at)
    VALUES (w.name, w.id, order_worker.action, coalesce(order_worker.exit_when_drained, false),
            coalesce(order_worker.by, current_user), now())
    ON CONFLICT ON CONSTRAINT worker_orders_pkey DO UPDATE
       SET worker_id = excluded.worker_id, action = excluded.action,
           exit_when_drained = excluded.exit_when_drained, asked_by = excluded.asked_by,
           asked_at = excluded.asked_at,
           drained_at = CASE WHEN o.action = excluded.action AND o.worker_id = excluded.worker_id
                             THEN o.drained_at END;
    PERFORM pg_notify('atlantis_control',
                      json_build_object('op', 'worker', 'worker', w.id)::text);
    id := w.id;
    name := w.name;
    silent := CASE WHEN w.liveness_interval IS NULL THEN w.expires_at < now()
                   ELSE now() - w.seen_at > make_interval(secs => 2 * w.liveness_interval) END;
    in_flight := w.in_flight;
    RETURN NEXT;
END
$$;

-- Lift the order of the supervisor `worker` (its id, its name, or the id an order was given
-- to): it claims again. Returns the name whose order was lifted; NULL when it had none.
-- Refused (ATL30) when nothing has that id or name.
CREATE OR REPLACE FUNCTION atlantis.resume_worker(worker text, by text) RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, atlantis, pg_temp
AS $$
DECLARE
    target text;
    lifted text;
    holder text;
BEGIN
    SELECT x.name INTO target FROM atlantis.workers x
     WHERE x.id = resume_worker.worker OR x.name = resume_worker.worker
     ORDER BY x.id = resume_worker.worker DESC, x.started_at DESC LIMIT 1;
    IF target IS NULL THEN
        SELECT o.name INTO target FROM atlantis.worker_orders o
         WHERE o.name = resume_worker.worker OR o.worker_id = resume_worker.worker LIMIT 1;
    END IF;
    IF target IS NULL THEN
        RAISE EXCEPTION 'no supervisor %', resume_worker.worker
              USING ERRCODE = 'ATL30',
                    HINT = 'tide worker list shows the live and silent ones';
    END IF;
    DELETE FROM atlantis.worker_orders o WHERE o.name = target
    RETURNING o.name, o.worker_id INTO lifted, holder;
    IF lifted IS NOT NULL THEN
        PERFORM pg_notify('atlantis_control',
                          json_build_object('op', 'worker', 'worker', holder,
                                            'by', coalesce(resume_worker.by, current_user))::text);
    END IF;
    RETURN lifted;
END
$$;
