"""Queues, their limits and supervisors as operators' tools (``tide``, the console) read them.

Every statement is a named query of ``admin.sql`` (the limits': of ``queries.sql``), read by column name into the dataclasses
below (:func:`atlantis.store.typed_rows.known_columns_row`, as in :mod:`atlantis.store.admin`).
Pausing, resuming and limiting a queue are :mod:`atlantis.operations`'s. Nothing here commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from atlantis.store.queries import Q
from atlantis.store.typed_rows import all_rows, one_row

Conn = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue: counts by state (``due``: available and due now; ``stalled``: running
    past the stall threshold), the oldest due job's wait, completions in the last minute and
    hour, whether an operator paused it, whether a declaration names it, how many live
    supervisors serve it, ``unserved_jobs``: the job types of due jobs that no live supervisor
    of the queue handles (see queue_stats in admin.sql), and ``unserved``: jobs are due and no
    live supervisor serves the queue, or some of them are of such a type."""

    queue: str
    available: int
    due: int
    running: int
    stalled: int
    complete: int
    dead: int
    cancelled: int
    oldest_waiting_seconds: float | None
    completed_last_minute: int
    completed_last_hour: int
    paused: bool
    paused_reason: str | None
    paused_by: str | None
    paused_at: datetime | None
    declared: bool
    supervisors: int
    unserved: bool
    approximate: list[str]
    unserved_jobs: list[str]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """A live supervisor (its registration has not expired), or one that expired while it
    still holds running rows; ``jobs`` are its in-flight attempts, ``[{"job_id",
    "attempt", "child_pid", "rss"}]`` (``rss`` in bytes); ``job_types`` the jobs it claims
    (None: a supervisor of an earlier release, which did not say); ``silent_for``: seconds
    since its last mark of life when it is silent (not seen for two of its
    ``liveness_interval``), else None."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    status: str
    jobs: list[dict[str, Any]]
    job_types: list[str] | None
    started_at: datetime
    seen_at: datetime
    expires_at: datetime
    db_now: datetime
    liveness_interval: float | None = None
    silent_for: float | None = None
    name: str | None = None
    """Its name, kept across its restarts (``--name``; None: a release that takes no orders)."""
    order_action: str | None = None
    """An operator's order kept for its name: ``drain`` or ``evict`` (None: none)."""
    ordered_by: str | None = None
    ordered_at: datetime | None = None

    @property
    def memory(self) -> int:
        """Resident memory of its children running attempts, in bytes."""
        return sum(int(j.get("rss") or 0) for j in self.jobs if isinstance(j, dict))


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits and what they hold (``atlantis.limit_usage``): ``concurrency_limit``,
    the queue-wide limit (None: none; ``tide queue limit``); ``limited_running``, running rows
    of limited jobs or of a limited queue (slots in use); ``held``, due waiting rows of them
    that are not running yet: held by a limit, or not claimed yet (counted up to
    :data:`HELD_CAP`). These are the keys ``tide queue stats --json`` and the console add to
    a queue's document."""

    concurrency_limit: int | None
    limited_running: int
    held: int


#: No limit and nothing limited: a queue :func:`queue_limits` was not asked about.
NO_LIMITS = QueueLimits(concurrency_limit=None, limited_running=0, held=0)


@dataclass(frozen=True, slots=True)
class _Known:
    known: bool


#: Counts by queue and state are exact up to this many rows; above, the planner's estimate.
COUNT_CAP = 10_000
#: ``unserved_jobs`` looks at this many due jobs per queue, the first in claim order.
UNSERVED_SAMPLE = 1_000


def queue_stats(conn: Conn, *, cap: int = COUNT_CAP,
                sample: int = UNSERVED_SAMPLE) -> list[QueueStats]:
    """Every queue anything names (declared ones even when empty), by name. A count above
    ``cap`` is the planner's estimate, and its state is listed in ``approximate``. The job
    types in ``unserved_jobs`` are those among the first ``sample`` due jobs of the queue,
    in claim order, that no live supervisor of the queue handles: a job nobody claims stays
    at the head of that order while the others are claimed."""
    return all_rows(conn, QueueStats, Q.queue_stats, {"cap": cap, "sample": sample})


def list_workers(conn: Conn) -> list[WorkerRow]:
    """Live supervisors, and silent ones that still hold running rows, oldest first."""
    return all_rows(conn, WorkerRow, Q.worker_list)


def queue_known(conn: Conn, queue: str) -> bool:
    """Whether a declaration, a job, a pause or a live supervisor names ``queue`` (else it is
    probably a typo)."""
    hit = one_row(conn, _Known, Q.queue_known, {"queue": queue})
    return hit is not None and hit.known


def job_served(conn: Conn, queue: str, job: str) -> bool:
    """Whether a live supervisor serves ``queue`` and claims jobs of type ``job``."""
    hit = one_row(conn, _Known, Q.job_served, {"queue": queue, "job": job})
    return hit is not None and hit.known


def queue_served(conn: Conn, queue: str) -> bool:
    """Whether a declaration names ``queue`` or some supervisor has served it."""
    hit = one_row(conn, _Known, Q.queue_served, {"queue": queue})
    return hit is not None and hit.known


#: ``atlantis.limit_usage`` counts a queue's held rows up to this many.
HELD_CAP = 10_000


def queue_limits(conn: Conn, queues: Sequence[str]) -> dict[str, QueueLimits]:
    """The limits of each of ``queues`` and the rows they hold, by queue name."""
    rows = conn.execute(Q.limit_usage, {"queues": list(queues)}).fetchall()
    return {r[0]: QueueLimits(concurrency_limit=r[1], limited_running=int(r[3]), held=int(r[4]))
            for r in rows}


def limit_hold(conn: Conn, job_id: int) -> str | None:
    """What holds a waiting job now (``atlantis.limit_hold``), as operators read it, e.g.
    ``waiting for a slot of `concurrency 1 by account_id=a1`: job 812 running``; None when no
    limit does (or it is not waiting, or not due)."""
    row = conn.execute(Q.limit_hold, {"id": job_id}).fetchone()
    return None if row is None or row[0] is None else str(row[0])
