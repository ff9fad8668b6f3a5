-- The two spawns of live/children.sql share what they do once fenced (the refusal of a job
-- being cancelled, the enqueue, the adoption of the rows this transaction inserted):
-- atlantis.spawn_rows, whose body lives in live/children.sql. A migration of its own: 0028
-- was applied as it shipped.
CREATE FUNCTION atlantis.spawn_rows(job_id bigint, name text, job_name text,
                                    args_list jsonb[], run_at timestamptz, priority int,
                                    queue text, delay interval, trace_context jsonb)
RETURNS TABLE (child bigint, fresh boolean)
LANGUAGE plpgsql AS $$ BEGIN RETURN; END $$;
