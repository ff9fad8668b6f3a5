"""Which run of a job writes its handler steps: the fence that every step's write checks.

Kept here, apart from the store that checks it (:mod:`atlantis.store.steps`), so that a child
names its run without importing psycopg: a child whose app never touches the database
never loads it (some 20 MB of resident memory and 60 ms of CPU at every start).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fence:
    """Which run writes: the job and the run id of its claim, and the attempt (shown)."""

    job_id: int
    run_id: str
    attempt: int
