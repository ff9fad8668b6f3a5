-- atlantis schema, version 2: bounded error history.
-- `errors` keeps the last 20 failures of a job; `error_count` counts them all.

ALTER TABLE atlantis.jobs ADD COLUMN error_count int NOT NULL DEFAULT 0;
UPDATE atlantis.jobs SET error_count = jsonb_array_length(errors) WHERE errors <> '[]';
UPDATE atlantis.jobs
   SET errors = (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]')
                   FROM jsonb_array_elements(errors) WITH ORDINALITY AS x(e, n)
                  WHERE n > jsonb_array_length(errors) - 20)
 WHERE jsonb_array_length(errors) > 20;
ALTER TABLE atlantis.jobs
    ADD CONSTRAINT jobs_error_count_check CHECK (error_count >= 0),
    ADD CONSTRAINT jobs_errors_bounded_check CHECK (jsonb_array_length(errors) <= 20);

-- Append one failure to a job's history, keeping the last 20.
CREATE FUNCTION atlantis.errors_append(history jsonb, entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_array_length(history) < 20 THEN history || jsonb_build_array(entry)
                ELSE (history - 0) || jsonb_build_array(entry) END
$$;
