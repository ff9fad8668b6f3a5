-- Attempt warnings (issue 36): what atlantis had to do about an attempt that ended well
-- enough, said on the attempt itself instead of only in the supervisor's log; today, the
-- threads and processes a handler left running when it returned, which the supervisor
-- ended. Additive: a supervisor one release behind writes no warning (NULL).

-- One line a person reads in `tide job status` and the console (at most 4096 characters).
ALTER TABLE atlantis.attempts ADD COLUMN warning text
    CHECK (warning IS NULL OR length(warning) <= 4096);
