-- Who cancelled a job, as every cancelled attempt's error and last_error say it: one home
-- for the text the finish, rescue and release statements (queries.sql) write. A plain SQL
-- function, IMMUTABLE: PostgreSQL inlines it, so the hot path pays nothing for the call.
CREATE FUNCTION atlantis.cancel_message(by text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'cancelled by ' || coalesce(by, 'an operator') $$;
