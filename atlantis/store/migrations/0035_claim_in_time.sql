-- Claims in one statement (issue 38): atlantis.claim_in_time(deadline), which the claim and
-- claim_limited queries call after the claim and before its implicit COMMIT, raising
-- query_canceled once `deadline` (PostgreSQL's clock) has passed, so that a claim that ran
-- late rolls back whole: the claimer no longer wraps it in BEGIN ... COMMIT (two round trips
-- fewer on the limited path, where every idle child waits for the claim). The body lives in
-- live/limited_claims.sql; the function is made here. Additive: a supervisor of 0.2 still
-- sends its claim in a transaction of its own.

CREATE FUNCTION atlantis.claim_in_time(deadline timestamptz) RETURNS boolean
LANGUAGE sql AS $$ SELECT true $$;
