-- A workflow whose undo is owed keeps its unique key (issue 31). Until now the key was held
-- only while `running` or `compensating`: a workflow that ended `compensation_failed` let a
-- second one of the same key start while its own undo was still owed, and a retry of the
-- first then failed on the index with a raw unique_violation.
--
-- The key is now held in every state in which the workflow may still act on the world:
-- `running`, `compensating`, and `compensation_failed` until an operator dismisses it
-- (atlantis.dismiss_workflow, `tide workflow dismiss`): dismissing gives the undo up and
-- frees the key. `failed`, `cancelled` and `complete` free it, as before. The state set
-- does not grow: a dismissal is recorded in `dismissed_at` / `dismissed_by`.

LOCK TABLE atlantis.workflow_instances IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE atlantis.workflow_instances
    ADD COLUMN dismissed_at timestamptz,
    ADD COLUMN dismissed_by text;

-- Keys the old index let two workflows hold: a `compensation_failed` one and a later one
-- of the same key (running, compensating, or compensation_failed too). The key stays with
-- the one that runs or compensates, else with the newest; every other is marked dismissed
-- by this migration (its undo is still owed: `tide workflow retry` runs it once the key is
-- free, and names the holder until then). docs/upgrading.md says so.
UPDATE atlantis.workflow_instances i
   SET dismissed_at = now(), dismissed_by = 'migration 0022'
 WHERE i.unique_key IS NOT NULL AND i.state = 'compensation_failed'
   AND EXISTS (SELECT 1 FROM atlantis.workflow_instances h
                WHERE h.workflow = i.workflow AND h.id <> i.id
                  AND atlantis.key_digest(h.unique_key) = atlantis.key_digest(i.unique_key)
                  AND (h.state IN ('running', 'compensating')
                       OR (h.state = 'compensation_failed' AND h.id > i.id)));

-- Only a compensation_failed workflow is ever dismissed, and always by someone.
ALTER TABLE atlantis.workflow_instances
    ADD CONSTRAINT workflow_instances_dismissed_check CHECK (
        dismissed_at IS NULL OR (state = 'compensation_failed' AND dismissed_by IS NOT NULL));

DROP INDEX atlantis.workflow_instances_unique_idx;
CREATE UNIQUE INDEX workflow_instances_unique_idx ON atlantis.workflow_instances
    (workflow, atlantis.key_digest(unique_key))  -- a digest: keys of any length (0021)
    WHERE unique_key IS NOT NULL AND dismissed_at IS NULL
      AND state IN ('running', 'compensating', 'compensation_failed');

-- What operators read (CONTRACT §9), with the dismissal appended.
CREATE OR REPLACE VIEW atlantis.workflows AS
SELECT w.id, w.workflow, w.args, w.state, w.created_at, w.finished_at, w.error,
       w.failed_step, w.cause, w.deadline, w.cancel_requested_at, w.cancelled_by,
       w.retried_by, w.retried_at, w.dismissed_at, w.dismissed_by
  FROM atlantis.workflow_instances w;

-- The functions, with placeholder bodies: atlantis/store/live/*.sql defines them.
CREATE FUNCTION atlantis.workflow_key_holder(workflow_name text, key text) RETURNS bigint
LANGUAGE sql AS $$ SELECT NULL::bigint $$;
CREATE FUNCTION atlantis.dismiss_workflow(workflow_id bigint, by text DEFAULT current_user)
RETURNS text LANGUAGE sql AS $$ SELECT NULL::text $$;
CREATE FUNCTION atlantis.workflow_for_operator(workflow_id bigint)
RETURNS atlantis.workflow_instances LANGUAGE sql AS $$ SELECT NULL::atlantis.workflow_instances $$;
