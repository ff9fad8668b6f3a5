-- ---- Limits (migration 0018) ------------------------------------------------------------
-- A row of a limited job turns `running` only through the trigger jobs_limit_claim
-- (atlantis.limit_claim). Each limit that applies to the row has a key; under a
-- transaction-scoped advisory lock per key, taken in one fixed order and never waited for, the
-- trigger counts what the key holds in a snapshot taken after the lock: running rows for a
-- concurrency limit (so a slot is free the moment its row leaves `running`, by any path, in
-- that transaction), open windows of atlantis.limit_starts for a rate. A full limit leaves
-- the row `available`, untouched: the claim statement does not return it.

-- The canonical values of `by` fields of `args` (as unique keys take them), a JSON array.
-- PL/pgSQL of simple expressions: its plans are kept, and it runs for every running row a
-- limit counts.
CREATE OR REPLACE FUNCTION atlantis.limit_value(decl atlantis.job_types, args jsonb, by text[])
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    out jsonb := '[]';
    f text;
    d jsonb;
BEGIN
    FOREACH f IN ARRAY coalesce(by, '{}') LOOP
        d := jsonb_path_query_first(decl.fields, '$[*] ? (@.name == $n)',
                                    jsonb_build_object('n', f));
        out := out || jsonb_build_array(atlantis.canonical_value(
            d->>'type', coalesce((d->>'array')::boolean, false), args->f));
    END LOOP;
    RETURN out;
END
$$;

-- The `by` fields of every limit of `limits`, in order of first appearance: what a row's
-- group is made of.
CREATE OR REPLACE FUNCTION atlantis.limit_fields(limits jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    every jsonb := jsonb_path_query_array(coalesce(limits, '[]'), '$[*].by[*]');
    out text[] := '{}';
    f text;
BEGIN
    FOR i IN 0 .. jsonb_array_length(every) - 1 LOOP
        f := every->>i;
        IF NOT f = ANY (out) THEN
            out := out || f;
        END IF;
    END LOOP;
    RETURN out;
END
$$;

-- A row's group (jobs.limit_group): NULL when no limit applies, '' when its job's limits
-- name no `by` field, else the digest (atlantis.key_digest) of the values of every `by`
-- field they name, in order, as JSON (migration 0021: any value the args accept).
CREATE OR REPLACE FUNCTION atlantis.limit_group(decl atlantis.job_types, args jsonb,
                                                queue_limited boolean) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    fields text[];
BEGIN
    IF decl.job IS NULL OR jsonb_array_length(decl.limits) = 0 THEN
        RETURN CASE WHEN queue_limited THEN '' END;
    END IF;
    fields := atlantis.limit_fields(decl.limits);
    IF cardinality(fields) = 0 THEN
        RETURN '';
    END IF;
    RETURN atlantis.key_digest(atlantis.limit_value(decl, args, fields)::text);
END
$$;

-- A period as .atl writes it, in the largest unit that divides it exactly (as
-- atlantis.declarations.model.period_text): 1m, 5s, 1h, 1d, 90s, 1s500ms.
CREATE OR REPLACE FUNCTION atlantis.limit_period_text(period interval) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ms % 86400000 = 0 THEN (ms / 86400000) || 'd'
                WHEN ms % 3600000 = 0 THEN (ms / 3600000) || 'h'
                WHEN ms % 60000 = 0 THEN (ms / 60000) || 'm'
                WHEN ms % 1000 = 0 THEN (ms / 1000) || 's'
                WHEN ms > 1000 THEN (ms / 1000) || 's' || (ms % 1000) || 'ms'
                ELSE ms || 'ms' END
      FROM (SELECT round(extract(epoch FROM period) * 1000)::bigint AS ms) p
$$;

-- The limits that apply to a row of `decl` on queue `q` with `args` now, in one fixed order
-- (the job's, as declared, then its queue's): its key (what the advisory lock and
-- atlantis.limit_starts are keyed on: the digest of the job, kind and values, migration
-- 0021), kind, N, period (rate), `by` fields and their
-- values, scope (`group`: one of the row's by-values; `job`: all of its job; `queue`: all
-- of its queue), the label operators read, and whether its `by` fields are all of the
-- group's (`whole`: rows of the same key have the same limit_group). PL/pgSQL of simple
-- expressions, but for the queue's lookup: the trigger runs it for every limited claim.
CREATE OR REPLACE FUNCTION atlantis.limit_rows(decl atlantis.job_types, q text, args jsonb)
RETURNS atlantis.limit_row[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    out atlantis.limit_row[] := '{}';
    l jsonb;
    r atlantis.limit_row;
    group_fields text[];
    key_by text;
    label_by text;
    v jsonb;
    qc int;
BEGIN
    IF decl.job IS NOT NULL AND jsonb_array_length(decl.limits) > 0 THEN
        group_fields := atlantis.limit_fields(decl.limits);
        FOR i IN 0 .. jsonb_array_length(decl.limits) - 1 LOOP
            l := decl.limits->i;
            r.kind := l->>'kind';
            r.n := (l->>'n')::int;
            r.period := CASE WHEN r.kind = 'rate'
                             THEN make_interval(secs => (l->>'period')::double precision) END;
            r.fields := '{}';
            FOR k IN 0 .. jsonb_array_length(coalesce(l->'by', '[]')) - 1 LOOP
                r.fields := r.fields || (l->'by'->>k);
            END LOOP;
            r.val := atlantis.limit_value(decl, args, r.fields);
            key_by := '';
            label_by := '';
            FOR k IN 1 .. cardinality(r.fields) LOOP
                v := r.val->(k - 1);
                key_by := key_by || CASE WHEN k > 1 THEN ', ' ELSE ' by ' END
                          || r.fields[k] || '=' || v::text;
                label_by := label_by || CASE WHEN k > 1 THEN ', ' ELSE ' by ' END
                            || r.fields[k] || '='
                            || atlantis.key_text(CASE WHEN jsonb_typeof(v) = 'string'
                                                      THEN v #>> '{}' ELSE v::text END);
            END LOOP;
            r.key := atlantis.key_digest(decl.job || ' ' || r.kind || key_by);
            r.scope := CASE WHEN cardinality(r.fields) = 0 THEN 'job' ELSE 'group' END;
            r.label := r.kind || ' ' || r.n
                       || CASE WHEN r.kind = 'rate'
                               THEN '/' || atlantis.limit_period_text(r.period) ELSE '' END
                       || label_by;
            r.whole := r.fields = group_fields;
            out := out || r;
        END LOOP;
    END IF;
    SELECT qq.concurrency INTO qc FROM atlantis.queues qq
     WHERE qq.name = q AND qq.concurrency IS NOT NULL;
    IF qc IS NOT NULL THEN
        out := out || ROW('queue ' || q, 'concurrency', qc, NULL::interval, '{}'::text[],
                          '[]'::jsonb, 'queue', 'queue ' || q || ' concurrency ' || qc,
                          false)::atlantis.limit_row;
    END IF;
    RETURN out;
END
$$;

-- atlantis.limit_rows as rows (tide, the console, atlantis.limit_hold).
CREATE OR REPLACE FUNCTION atlantis.row_limits(decl atlantis.job_types, q text, args jsonb)
RETURNS TABLE (key text, kind text, n int, period interval, fields text[], val jsonb, scope text,
               label text, whole boolean)
LANGUAGE sql STABLE AS $$
    SELECT * FROM unnest(atlantis.limit_rows(decl, q, args))
$$;

-- The running rows a concurrency limit counts: of the queue (scope `queue`), or of the
-- job with the same values of `by` (none: all of the job's). When the limit's `by` fields
-- make the whole group (`whole`), its rows are found by their limit_group
-- (jobs_limited_running_idx); otherwise each running row of the job is compared.
CREATE OR REPLACE FUNCTION atlantis.limit_holders(decl atlantis.job_types, q text, scope text,
                                                  by text[], val jsonb, whole boolean)
RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT r.id FROM atlantis.jobs r
     WHERE scope = 'queue' AND r.state = 'running' AND r.queue = q
    UNION ALL
    SELECT r.id FROM atlantis.jobs r
     WHERE scope <> 'queue' AND whole AND r.state = 'running' AND r.limit_group IS NOT NULL
       AND r.job = decl.job AND r.limit_group = CASE WHEN cardinality(by) = 0 THEN ''
                                                     ELSE atlantis.key_digest(val::text) END
    UNION ALL
    SELECT r.id FROM atlantis.jobs r
     WHERE scope <> 'queue' AND NOT whole AND r.state = 'running' AND r.limit_group IS NOT NULL
       AND r.job = decl.job
       AND (cardinality(by) = 0 OR atlantis.limit_value(decl, r.args, by) = val)
$$;

-- A claim of a limited row was refused: tell atlantis.claim_limited what to skip for the
-- rest of its call (`scope`: `queue`, `job:NAME`, `group`), and when trying again makes
-- sense (`wake`; the earliest wins). Returns false: called in an assignment, which PL/pgSQL
-- evaluates without a statement of its own.
CREATE OR REPLACE FUNCTION atlantis.limit_refuse(scope text, wake timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    was text := nullif(current_setting('atlantis.limit_wake', true), '');
    ignored text;
BEGIN
    ignored := set_config('atlantis.limit_refused', scope, true);
    IF wake IS NOT NULL AND (was IS NULL OR wake < was::timestamptz) THEN
        ignored := set_config('atlantis.limit_wake', wake::text, true);
    END IF;
    RETURN false;
END
$$;

-- Trigger jobs_limit_claim: BEFORE a limited row turns `running`. Returns NULL (the row is
-- left as it was) unless every limit that applies has room; then records the rate starts.
-- The locks are tried, never waited for: claimers taking keys in any order cannot deadlock;
-- one that finds a key taken comes back 25 ms later. The counts run after the locks, each
-- in a snapshot of its own (a VOLATILE function's statements take one each under READ
-- COMMITTED): every claim of the key that committed before the lock was taken is counted,
-- and none can be in progress. A rate-limited attempt's started_at is the clock time its
-- start was recorded at, so the windows and the attempts agree.
CREATE OR REPLACE FUNCTION atlantis.limit_claim() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    decl atlantis.job_types;
    ls atlantis.limit_row[];
    l atlantis.limit_row;
    c timestamptz;
    cnt bigint;
    frees timestamptz;
    rated boolean := false;
    ignored boolean;
BEGIN
    SELECT t.* INTO decl FROM atlantis.job_types t WHERE t.job = NEW.job;
    ls := atlantis.limit_rows(decl, NEW.queue, NEW.args);
    FOREACH l IN ARRAY ls LOOP
        IF NOT pg_try_advisory_xact_lock(1635019891, hashtext(l.key)) THEN
            ignored := atlantis.limit_refuse(
                CASE l.scope WHEN 'job' THEN 'job:' || NEW.job ELSE l.scope END,
                clock_timestamp() + interval '25 milliseconds');
            RETURN NULL;
        END IF;
    END LOOP;
    c := clock_timestamp();
    FOREACH l IN ARRAY ls LOOP
        IF l.kind = 'concurrency' THEN
            IF l.scope = 'queue' THEN
                SELECT count(*) INTO cnt FROM atlantis.jobs r
                 WHERE r.state = 'running' AND r.queue = NEW.queue;
            ELSIF l.whole THEN
                SELECT count(*) INTO cnt FROM atlantis.jobs r
                 WHERE r.state = 'running' AND r.limit_group IS NOT NULL AND r.job = NEW.job
                   AND r.limit_group = CASE WHEN l.scope = 'job' THEN ''
                                            ELSE atlantis.key_digest(l.val::text) END;
            ELSE
                SELECT count(*) INTO cnt
                  FROM atlantis.limit_holders(decl, NEW.queue, l.scope, l.fields, l.val, false);
            END IF;
            IF cnt >= l.n THEN
                ignored := atlantis.limit_refuse(
                    CASE l.scope WHEN 'job' THEN 'job:' || NEW.job ELSE l.scope END, NULL);
                RETURN NULL;
            END IF;
        ELSE
            SELECT count(*), min(s.until) INTO cnt, frees FROM atlantis.limit_starts s
             WHERE s.key = l.key AND s.until > c;
            IF cnt >= l.n THEN
                IF cnt > l.n THEN  -- the limit was lowered: the window frees later
                    SELECT s.until INTO frees FROM atlantis.limit_starts s
                     WHERE s.key = l.key AND s.until > c
                     ORDER BY s.until OFFSET cnt - l.n LIMIT 1;
                END IF;
                ignored := atlantis.limit_refuse(
                    CASE l.scope WHEN 'job' THEN 'job:' || NEW.job ELSE l.scope END, frees);
                RETURN NULL;
            END IF;
        END IF;
    END LOOP;
    FOREACH l IN ARRAY ls LOOP
        IF l.kind = 'rate' THEN
            INSERT INTO atlantis.limit_starts (key, job_id, at, until)
            VALUES (l.key, NEW.id, c, c + l.period);
            rated := true;
        END IF;
    END LOOP;
    IF rated THEN
        NEW.started_at := c;
    END IF;
    IF NEW.limit_group = '' THEN  -- marked by a claim or a queue limit: its real group
        NEW.limit_group := coalesce(atlantis.limit_group(decl, NEW.args, true), '');
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION atlantis.limit_claim() FROM PUBLIC;
