-- Operators' orders to one supervisor (issue 37): `tide worker drain|evict|resume ID` and the
-- console's worker page. Carried through the database, so they reach a supervisor on any
-- host. An order is kept by the supervisor's *name* (`--name`; by default its host and the
-- queues it serves), not by its per-run id, so that a drained supervisor that restarts
-- (a crash, `Restart=`, a Kubernetes container restart) is still drained until
-- `tide worker resume`. Additive: a supervisor one release behind writes no name and takes
-- no orders (the functions refuse to order it, saying so).

-- The supervisor's stable name (NULL: a release one behind).
ALTER TABLE atlantis.workers ADD COLUMN name text;

-- At most one order per supervisor name; `tide worker resume` deletes it.
CREATE TABLE atlantis.worker_orders (
    -- The supervisor's name (atlantis.workers.name).
    name text PRIMARY KEY,
    -- The run it was given to, or the later run of the same name that adopted it at start.
    worker_id text NOT NULL,
    -- drain: finish the attempts in flight, claim nothing new, stay up idle.
    -- evict: stop the attempts now (as a drain timeout does, rows given back), then drained.
    action text NOT NULL CHECK (action IN ('drain', 'evict')),
    -- --exit: the run it was given to exits once drained (a later run stays up, drained).
    exit_when_drained boolean NOT NULL DEFAULT false,
    asked_by text NOT NULL,
    asked_at timestamptz NOT NULL DEFAULT now(),
    -- When the supervisor reported nothing in flight any more (NULL: not yet).
    drained_at timestamptz
);

CREATE FUNCTION atlantis.order_worker(worker text, action text, exit_when_drained boolean,
                                      by text)
RETURNS TABLE (id text, name text, silent boolean, in_flight int)
LANGUAGE sql AS $$ SELECT NULL::text, NULL::text, NULL::boolean, NULL::int WHERE false $$;
CREATE FUNCTION atlantis.resume_worker(worker text, by text) RETURNS text
LANGUAGE sql AS $$ SELECT NULL::text $$;
