-- The scaling signal (issue 37): atlantis.queue_signal(queue), per queue the rows claimable
-- now, the age of the oldest of them, running, delayed, held by a limit, suspended, and
-- whether the queue is paused; read from the jobs table alone, so that a queue can scale
-- from zero (no supervisor runs) and be alerted on. Readable by atlantis_reader (the role
-- step grants it with the other read functions). The bodies live in live/signal.sql; the
-- functions are made here. No table, no index: the counts walk the claims' own indexes
-- (jobs_fetch_free_idx, jobs_fetch_idx, jobs_limited_idx, jobs_suspended_idx,
-- jobs_state_queue_idx), so enqueue and claims pay nothing for it. Additive.

CREATE FUNCTION atlantis.signal_estimate(filter text) RETURNS bigint
LANGUAGE sql AS $$ SELECT NULL::bigint $$;

CREATE FUNCTION atlantis.signal_waiting(q text, cap bigint, OUT due bigint, OUT limited bigint,
                                        OUT later bigint, OUT suspended bigint,
                                        OUT running bigint, OUT oldest timestamptz)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                          NULL::timestamptz $$;

CREATE FUNCTION atlantis.signal_scale(q text, cap bigint, INOUT due bigint,
                                      INOUT limited bigint, INOUT later bigint,
                                      INOUT suspended bigint, INOUT running bigint,
                                      OUT exact boolean)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                          NULL::boolean $$;

CREATE FUNCTION atlantis.signal_room(job_name text, q text, args jsonb, taken jsonb,
                                     running jsonb, in_queue bigint, OUT room bigint,
                                     OUT keys text[])
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::text[] $$;

CREATE FUNCTION atlantis.signal_limited(q text, cap bigint, span int, total bigint,
                                        OUT claimable bigint, OUT held bigint,
                                        OUT oldest timestamptz, OUT exact boolean)
LANGUAGE sql AS $$ SELECT NULL::bigint, NULL::bigint, NULL::timestamptz, NULL::boolean $$;

CREATE FUNCTION atlantis.signal_queues() RETURNS text[]
LANGUAGE sql AS $$ SELECT NULL::text[] $$;

-- One row of atlantis.queue_signal: a type of its own, so that the argument may be named
-- `queue` as the column is (a RETURNS TABLE column and an argument cannot share a name).
CREATE TYPE atlantis.queue_signal_row AS (
    queue text, claimable bigint, oldest_claimable_seconds float8, running bigint,
    delayed bigint, limit_held bigint, suspended bigint, paused boolean, exact boolean
);

CREATE FUNCTION atlantis.queue_signal(queue text DEFAULT NULL)
RETURNS SETOF atlantis.queue_signal_row
LANGUAGE sql AS $$ SELECT NULL::atlantis.queue_signal_row WHERE false $$;
