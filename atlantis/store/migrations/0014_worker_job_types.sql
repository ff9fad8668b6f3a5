-- The jobs each supervisor claims. A reload (SIGHUP) may add or remove job types, so the
-- queues a supervisor serves no longer say which jobs it runs: tide queue stats, tide db
-- doctor and the console flag due jobs of a type that no live supervisor of their queue
-- handles. NULL: a supervisor of an earlier release, which says nothing (taken to handle
-- every job of its queues).
ALTER TABLE atlantis.workers ADD COLUMN job_types text[];
