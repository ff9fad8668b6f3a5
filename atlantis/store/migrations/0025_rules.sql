-- Each rule written once (issue 32): the error entry of a cancelled attempt, whether a
-- failed attempt was the job's last, and the cap on a checkpoint's message, each one
-- function that every statement asks. The bodies live in atlantis/store/live/claims.sql.
CREATE FUNCTION atlantis.cancel_entry(run int, attempt int, by text) RETURNS jsonb
LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION atlantis.out_of_attempts(attempt int, max_attempts int) RETURNS boolean
LANGUAGE sql AS $$ SELECT false $$;
CREATE FUNCTION atlantis.progress_text(msg text) RETURNS text
LANGUAGE sql AS $$ SELECT msg $$;
