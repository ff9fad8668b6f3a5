"""Jobs as operators' tools (``tide``, the console) read them: a job, its ended attempts
and its log lines, as typed rows; queues and supervisors are :mod:`atlantis.store.fleet`'s.

Every statement is a named query of ``admin.sql``; every row is read by column name into
one of the dataclasses below (:func:`atlantis.store.typed_rows.known_columns_row`): a column
the dataclass lacks fails the read loudly, a column it does not know is left out (a schema
one release ahead may have added it, docs/upgrading.md). Changes of a job's or a queue's
state are :mod:`atlantis.operations`'s (the SQL functions every path shares); the documents
``--json`` and the API show are :mod:`atlantis.presentation`'s. Nothing here commits: on an
autocommit connection each call is its own transaction, otherwise the caller's transaction
holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from atlantis.store.queries import Q
from atlantis.store.typed_rows import all_rows, one_row

#: The states a job can be in (``atlantis.jobs.state``).
STATES = ("available", "running", "complete", "dead", "cancelled")
#: The states a job never leaves by itself.
FINISHED = ("complete", "dead", "cancelled")

Conn = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job: every column of ``atlantis.jobs`` (``admin.sql``: ``job_get``, ``job_list``).

    ``timeout``, ``heartbeat`` and ``backoff`` are seconds. ``errors`` holds the last 20
    failures and ``error_count`` counts them all. Not columns: ``stall_after`` (seconds
    without a checkpoint after which a running job is stalled: the declaration's ``stall``,
    else 3 x heartbeat), ``stalled``, and ``db_now``, the database's clock when the row was
    read, which ages ("12s ago") are measured against.
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
    backoff: float
    unique_key: str | None
    cancel_requested_at: datetime | None
    cancelled_by: str | None
    retried_by: str | None
    retried_at: datetime | None
    progress_history: list[dict[str, Any]]
    run: int
    """1 for a new job, one more after each retry; ``attempt`` counts from 1 again in each
    run (a retry gives a fresh budget)."""
    workflow_id: int | None
    """The workflow whose step (or compensation) this row is; None outside workflows."""
    step: str | None
    compensation: bool
    """True on a compensation's row, whose ``step`` is the step it undoes."""
    result: Any
    """The handler's return value (JSON) once the job completed; None before, or if it
    returned nothing (or a value that could not be stored)."""
    limit_group: str | None
    """The values of its job's limits' ``by`` fields ('' when they name none); None when no
    limit applies to it (migration 0018)."""
    trace_context: dict[str, str] | None
    """The enqueuer's W3C trace context (``traceparent``, ``tracestate``) when it traced
    (migration 0019); None otherwise."""
    run_id: UUID | None
    """The run id of its latest claim, which the handler steps' writes are fenced on
    (migration 0026); None before its first claim."""
    suspended_for: str | None
    """What it waits for (``sleep:<step>``) while ``available`` after a durable sleep; it
    runs again at ``run_at`` (migration 0026); ``event:<event>`` while it waits for an
    event, ``join:<step>`` while it waits for the jobs it joined (migrations 0027, 0028)."""
    parent_id: int | None
    """The job whose handler spawned this one (``ctx.spawn``, migration 0028); None for a
    job enqueued otherwise."""
    stall_after: float
    stalled: bool
    db_now: datetime

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def last_checkpoint(self) -> datetime | None:
        """When the running attempt last showed life by a checkpoint (its claim before one)."""
        if self.progress_at is not None and (self.started_at is None
                                             or self.progress_at >= self.started_at):
            return self.progress_at
        return self.started_at

    @property
    def last_renewal(self) -> datetime | None:
        """When the lease was last extended: its expiry minus one heartbeat."""
        if self.claimed_until is None:
            return None
        return self.claimed_until - timedelta(seconds=self.heartbeat)

    @property
    def holder(self) -> tuple[str, int | None] | None:
        """(host, pid) of the supervisor holding or last holding the job (``claimed_by`` is
        ``host:pid:random``), or None."""
        return parse_worker(self.claimed_by)


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One ended attempt of a job (``atlantis.attempts``): the timeline. ``run`` is the job's
    run it belongs to (attempts count from 1 again after each retry)."""

    id: int
    run: int
    attempt: int
    worker: str | None
    host: str | None
    pid: int | None
    child_pid: int | None
    started_at: datetime | None
    finished_at: datetime
    outcome: str
    error_kind: str | None
    log_lines: int
    log_dropped: int
    warning: str | None = None
    """What atlantis had to do about the attempt (migration 0030): the work it left running
    that the supervisor ended."""


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line an attempt, (``run``, ``attempt``), wrote to its stdout or stderr
    (``atlantis.logs``)."""

    id: int
    run: int
    attempt: int
    at: datetime
    stream: str
    line: str


@dataclass(frozen=True, slots=True)
class _Version:
    version: int | None


@dataclass(frozen=True, slots=True)
class _Attempt:
    run: int
    attempt: int


@dataclass(frozen=True, slots=True)
class _Attempts:
    attempts: int | None


@dataclass(frozen=True, slots=True)
class _Deleted:
    deleted: int | None


def parse_worker(worker: str | None) -> tuple[str, int | None] | None:
    """(host, pid) from a worker id ``host:pid:random``; (id, None) for another shape."""
    if not worker:
        return None
    parts = worker.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return worker, None


def schema_version(conn: Conn) -> int | None:
    """The newest migration applied; raises (UndefinedTable) when the schema is missing."""
    hit = one_row(conn, _Version, Q.schema_version)
    return None if hit is None else hit.version


def get_job(conn: Conn, job_id: int) -> JobRow | None:
    """The job with this id, or None."""
    return one_row(conn, JobRow, Q.job_get, {"id": job_id})


def list_jobs(conn: Conn, *, queue: str | None = None, state: str | None = None,
              stalled: bool = False, limit: int = 50) -> list[JobRow]:
    """The newest ``limit`` jobs, of ``queue``, in ``state`` and only stalled ones when asked."""
    return all_rows(conn, JobRow, Q.job_list,
                {"queue": queue, "state": state, "stalled": stalled, "limit": limit})


def job_attempts(conn: Conn, job_id: int) -> list[AttemptRow]:
    """The attempts of a job that ended, oldest first (the running one is the job row)."""
    return all_rows(conn, AttemptRow, Q.job_attempts, {"job_id": job_id})


def prune(conn: Conn, older_than: float, states: list[str], *, batch: int = 1000) -> int:
    """Delete jobs in ``states`` that finished more than ``older_than`` seconds ago, with
    their attempts and logs, ``batch`` rows a statement (each its own transaction on an
    autocommit connection); returns how many."""
    total = 0
    while True:
        hit = one_row(conn, _Deleted, Q.operator_prune, {
            "older_than": timedelta(seconds=older_than), "states": states, "batch": batch})
        deleted = 0 if hit is None or hit.deleted is None else hit.deleted
        total += deleted
        if deleted < batch:
            return total


def log_lines(conn: Conn, job_id: int, attempt: int, *, run: int, after: int = 0,
              limit: int = 1000) -> list[LogLine]:
    """Up to ``limit`` lines of attempt ``attempt`` of run ``run`` written after line id
    ``after``, in order."""
    return all_rows(conn, LogLine, Q.job_log_lines, {"job_id": job_id, "run": run,
                                                 "attempt": attempt, "after": after,
                                                 "limit": limit})


def latest_log(conn: Conn, job_id: int, *, run: int | None = None) -> tuple[int, int] | None:
    """(run, attempt) of the attempt that wrote the job's newest log line (in run ``run``
    when given), or None when it has none."""
    hit = one_row(conn, _Attempt, Q.job_log_attempt, {"job_id": job_id, "run": run})
    return None if hit is None else (hit.run, hit.attempt)


def latest_log_attempt(conn: Conn, job_id: int, *, run: int | None = None) -> int | None:
    """The attempt that wrote the job's newest log line (in run ``run`` when given), or
    None when it has none."""
    hit = latest_log(conn, job_id, run=run)
    return None if hit is None else hit[1]


def run_attempts(conn: Conn, job_id: int, run: int) -> int:
    """How many attempts run ``run`` of a job has had by its timeline and logs (0: none;
    the running attempt is the job row's)."""
    hit = one_row(conn, _Attempts, Q.job_run_attempts, {"job_id": job_id, "run": run})
    return 0 if hit is None or hit.attempts is None else hit.attempts
