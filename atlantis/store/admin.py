"""What operators' tools (``tide``, the console) read and change, as typed rows.

Every statement is a named query of ``admin.sql``; every row is read through
:func:`psycopg.rows.class_row` into one of the dataclasses below, whose fields are the
statement's columns by name (a column added to a statement needs a field here, or the read
fails loudly). Nothing here commits: on an autocommit connection each call is its own
transaction, otherwise the caller's transaction holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import class_row

from atlantis.store.queries import Q

#: The states a job can be in (``atlantis.jobs.state``).
STATES = ("available", "running", "complete", "dead", "cancelled")
#: The states a job never leaves by itself.
FINISHED = ("complete", "dead", "cancelled")

Conn = psycopg.Connection[Any]
_Row = TypeVar("_Row")


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job, every column ``tide job status`` shows (``admin.sql``: ``job_get``).

    ``timeout`` and ``heartbeat`` are seconds. ``errors`` holds the last 20 failures and
    ``error_count`` counts them all. ``db_now`` is not a column: it is the database's clock
    when the row was read, which ages ("12s ago") are measured against.
    """

    id: int
    job: str
    queue: str
    args: dict[str, Any]
    state: str
    attempt: int
    max_attempts: int
    priority: int
    run_at: datetime
    timeout: float
    heartbeat: float
    claimed_by: str | None
    claimed_until: datetime | None
    progress_pct: int | None
    progress_msg: str | None
    progress_at: datetime | None
    last_error: str | None
    errors: list[dict[str, Any]]
    error_count: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    db_now: datetime

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def document(self) -> dict[str, Any]:
        """The row's columns by name (``db_now`` left out), for ``--json`` and the API."""
        doc = as_dict(self)
        del doc["db_now"]
        return doc


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One line of a job listing (``job_list``), newest first."""

    id: int
    job: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    priority: int
    run_at: datetime
    progress_pct: int | None
    progress_msg: str | None
    last_error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's counts by state, its oldest waiting age and recent throughput."""

    queue: str
    available: int
    running: int
    complete: int
    dead: int
    cancelled: int
    oldest_waiting_seconds: float | None
    completed_last_minute: int


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """A live supervisor (its registration has not expired)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    status: str
    started_at: datetime
    seen_at: datetime


@dataclass(frozen=True, slots=True)
class _Retried:
    id: int
    queue: str


@dataclass(frozen=True, slots=True)
class _Cancelled:
    id: int
    state: str


@dataclass(frozen=True, slots=True)
class _Known:
    known: bool


def as_dict(row: Any) -> dict[str, Any]:
    """A row's fields by name, in column order (shallow: values are not copied)."""
    return {f.name: getattr(row, f.name) for f in fields(row)}


def _all(conn: Conn, cls: type[_Row], query: LiteralString,
         params: dict[str, Any] | None = None) -> list[_Row]:
    return conn.cursor(row_factory=class_row(cls)).execute(query, params).fetchall()


def _one(conn: Conn, cls: type[_Row], query: LiteralString,
         params: dict[str, Any] | None = None) -> _Row | None:
    return conn.cursor(row_factory=class_row(cls)).execute(query, params).fetchone()


def get_job(conn: Conn, job_id: int) -> JobRow | None:
    """The job with this id, or None."""
    return _one(conn, JobRow, Q.job_get, {"id": job_id})


def list_jobs(conn: Conn, *, queue: str | None = None, state: str | None = None,
              limit: int = 50) -> list[JobSummary]:
    """The newest ``limit`` jobs, of ``queue`` and in ``state`` when given."""
    return _all(conn, JobSummary, Q.job_list, {"queue": queue, "state": state, "limit": limit})


def retry_job(conn: Conn, job_id: int) -> bool:
    """Put a ``dead`` or ``cancelled`` job back to ``available`` with a fresh attempt budget.

    Wakes its queue's supervisors. False if the job is missing or in another state.
    """
    with conn.transaction():
        hit = _one(conn, _Retried, Q.job_retry, {"id": job_id})
        if hit is None:
            return False
        conn.execute(Q.notify_queue, {"queue": hit.queue})
    return True


def cancel_job(conn: Conn, job_id: int) -> str | None:
    """Cancel a job: the state it is in afterwards, or None if there was nothing to cancel.

    ``cancelled`` for a job that was waiting; ``running`` for a running one, whose
    supervisor now stops the attempt (the job ends ``cancelled``).
    """
    hit = _one(conn, _Cancelled, Q.job_cancel, {"id": job_id})
    return None if hit is None else hit.state


def queue_stats(conn: Conn) -> list[QueueStats]:
    """Every queue that has jobs, by name."""
    return _all(conn, QueueStats, Q.queue_stats)


def list_workers(conn: Conn) -> list[WorkerRow]:
    """Live supervisors, oldest first."""
    return _all(conn, WorkerRow, Q.worker_list)


def queue_known(conn: Conn, queue: str) -> bool:
    """Whether a declaration or any job uses ``queue`` (else it is probably a typo)."""
    hit = _one(conn, _Known, Q.queue_known, {"queue": queue})
    return hit is not None and hit.known
