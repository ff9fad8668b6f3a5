-- One home for the retry delay (issue 31): atlantis.retry_delay takes the cap
-- (--max-backoff) and is what the finish statement and the rescue both apply; the version
-- of 0001, which nothing called, goes. The body lives in atlantis/store/live/*.sql.
DROP FUNCTION atlantis.retry_delay(interval, int);
CREATE FUNCTION atlantis.retry_delay(base interval, failures int, cap interval)
RETURNS interval
LANGUAGE sql AS $$ SELECT interval '0' $$;
