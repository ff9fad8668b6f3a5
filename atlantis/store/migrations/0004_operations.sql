-- atlantis schema, version 4: operating long-running jobs.
-- Attempt history, attempt logs, checkpoint history, stall thresholds, queue pause,
-- cron schedules, who retried. Functions using these come in later migrations.

-- Declarations: `stall D` (NULL: 3 x heartbeat), `schedule "CRON"` and `tz "Area/City"`.
ALTER TABLE atlantis.job_types
    ADD COLUMN stall interval CHECK (stall > interval '0'),
    ADD COLUMN schedule text,
    ADD COLUMN tz text;

ALTER TABLE atlantis.jobs
    -- Samples of the current attempt's checkpoints: [{"at": ts, "pct": n}], at most one a
    -- second, the last 200. Reset by each claim.
    ADD COLUMN progress_history jsonb NOT NULL DEFAULT '[]'
        CONSTRAINT jobs_progress_history_check CHECK (jsonb_typeof(progress_history) = 'array'),
    ADD COLUMN retried_by text,
    ADD COLUMN retried_at timestamptz,
    ADD COLUMN cancelled_by text;

-- Every attempt that ended (running ones are the job row itself): the timeline.
CREATE TABLE atlantis.attempts (
    id          bigserial PRIMARY KEY,
    job_id      bigint NOT NULL,
    attempt     int NOT NULL,
    worker      text,
    host        text,
    pid         int,
    child_pid   int,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    outcome     text NOT NULL,  -- complete, failed, discard, snooze, release, cancelled, lease_expired, ...
    error_kind  text,
    log_lines   int NOT NULL DEFAULT 0,
    log_dropped int NOT NULL DEFAULT 0
);
CREATE INDEX attempts_job_idx ON atlantis.attempts (job_id, id);

-- Each attempt's stdout and stderr, as the supervisor logged them (bounded per attempt).
CREATE TABLE atlantis.logs (
    id      bigserial PRIMARY KEY,
    job_id  bigint NOT NULL,
    attempt int NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    stream  text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    line    text NOT NULL
);
CREATE INDEX logs_job_idx ON atlantis.logs (job_id, attempt, id);

-- Queues an operator paused (a queue with no row, or paused = false, is served).
CREATE TABLE atlantis.queues (
    name       text PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    reason     text,
    changed_by text,
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- One enqueue per schedule slot, however many supervisors run.
CREATE TABLE atlantis.schedule_runs (
    job        text NOT NULL,
    slot       timestamptz NOT NULL,
    job_id     bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, slot)
);

-- What each supervisor runs now: [{"job_id", "attempt", "child_pid", "rss"}].
ALTER TABLE atlantis.workers ADD COLUMN jobs jsonb NOT NULL DEFAULT '[]';

-- Finished jobs are pruned by age: an index for it.
CREATE INDEX jobs_finished_idx ON atlantis.jobs (finished_at) WHERE finished_at IS NOT NULL;
