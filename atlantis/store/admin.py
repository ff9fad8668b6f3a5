"""What operators' tools (``tide``, the console) read and change, as typed rows.

Every statement is a named query of ``admin.sql``; every row is read by column name into
one of the dataclasses below (:func:`atlantis.store.rows.known_columns_row`): a column the
dataclass lacks fails the read loudly, a column it does not know is left out (a schema one
release ahead may have added it, docs/upgrading.md). Changes go through
:mod:`atlantis.operations`, that is through the SQL functions every path shares. Nothing
here commits: on an autocommit connection each call is its own transaction, otherwise the
caller's transaction holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, LiteralString, TypeVar

import psycopg

from atlantis import operations, progress
from atlantis.store.queries import Q
from atlantis.store.rows import known_columns_row

#: The states a job can be in (``atlantis.jobs.state``).
STATES = ("available", "running", "complete", "dead", "cancelled")
#: The states a job never leaves by itself.
FINISHED = ("complete", "dead", "cancelled")

Conn = psycopg.Connection[Any]
_Row = TypeVar("_Row")


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
    stall_after: float
    stalled: bool
    db_now: datetime

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def running(self) -> bool:
        return self.state == "running"

    def estimate(self) -> progress.Estimate:
        """Rate (pct/min) and ETA of this attempt, from its checkpoint history."""
        return progress.estimate(self.progress_history, pct=self.progress_pct,
                                 at=self.progress_at, now=self.db_now, running=self.running)

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

    def document(self) -> dict[str, Any]:
        """Every column by name (``db_now`` left out) and the computed ``stalled``,
        ``stall_after``, ``rate`` (pct/min) and ``eta_seconds``, for ``--json`` and the API."""
        doc = as_dict(self)
        del doc["db_now"]
        guess = self.estimate()
        doc["rate"] = guess.rate
        doc["eta_seconds"] = guess.eta_seconds
        return doc


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
    """A live supervisor (its registration has not expired); ``jobs`` are its in-flight
    attempts, ``[{"job_id", "attempt", "child_pid", "rss"}]`` (``rss`` in bytes);
    ``job_types`` the jobs it claims (None: a supervisor of an earlier release, which did not
    say)."""

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

    @property
    def memory(self) -> int:
        """Resident memory of its children running attempts, in bytes."""
        return sum(int(j.get("rss") or 0) for j in self.jobs if isinstance(j, dict))

    def document(self) -> dict[str, Any]:
        doc = as_dict(self)
        del doc["db_now"]
        doc["memory"] = self.memory
        return doc


@dataclass(frozen=True, slots=True)
class _Version:
    version: int | None


@dataclass(frozen=True, slots=True)
class _Known:
    known: bool


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


def json_default(value: Any) -> Any:
    """What orjson cannot write itself, as tide and the console show it: times in ISO 8601,
    durations in seconds, decimals as numbers, sets and tuples as lists."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def as_dict(row: Any) -> dict[str, Any]:
    """A row's fields by name, in column order (shallow: values are not copied)."""
    return {f.name: getattr(row, f.name) for f in fields(row)}


def parse_worker(worker: str | None) -> tuple[str, int | None] | None:
    """(host, pid) from a worker id ``host:pid:random``; (id, None) for another shape."""
    if not worker:
        return None
    parts = worker.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return worker, None


def _all(conn: Conn, cls: type[_Row], query: LiteralString,
         params: dict[str, Any] | None = None) -> list[_Row]:
    return conn.cursor(row_factory=known_columns_row(cls)).execute(query, params).fetchall()


def _one(conn: Conn, cls: type[_Row], query: LiteralString,
         params: dict[str, Any] | None = None) -> _Row | None:
    return conn.cursor(row_factory=known_columns_row(cls)).execute(query, params).fetchone()


def schema_version(conn: Conn) -> int | None:
    """The newest migration applied; raises (UndefinedTable) when the schema is missing."""
    hit = _one(conn, _Version, Q.schema_version)
    return None if hit is None else hit.version


def get_job(conn: Conn, job_id: int) -> JobRow | None:
    """The job with this id, or None."""
    return _one(conn, JobRow, Q.job_get, {"id": job_id})


def list_jobs(conn: Conn, *, queue: str | None = None, state: str | None = None,
              stalled: bool = False, limit: int = 50) -> list[JobRow]:
    """The newest ``limit`` jobs, of ``queue``, in ``state`` and only stalled ones when asked."""
    return _all(conn, JobRow, Q.job_list,
                {"queue": queue, "state": state, "stalled": stalled, "limit": limit})


def job_attempts(conn: Conn, job_id: int) -> list[AttemptRow]:
    """The attempts of a job that ended, oldest first (the running one is the job row)."""
    return _all(conn, AttemptRow, Q.job_attempts, {"job_id": job_id})


def retry_job(conn: Conn, job_id: int, *, by: str | None = None) -> bool:
    """Put a ``dead`` or ``cancelled`` job back to ``available`` (:func:`atlantis.retry`).

    False if the job is in another state; raises JobNotFoundError for an unknown id and
    UniqueKeyTakenError when another job holds its unique key.
    """
    return operations.retry(conn, job_id, by=by) is not None


def cancel_job(conn: Conn, job_id: int, *, by: str | None = None) -> str | None:
    """Cancel a job (:func:`atlantis.cancel`): the state it is in afterwards, or None if it
    had finished. ``cancelled`` for a job that was waiting; ``running`` for a running one,
    whose supervisor now stops the attempt (the job ends ``cancelled``)."""
    return operations.cancel(conn, job_id, by=by)


def pause_queue(conn: Conn, queue: str, *, reason: str | None = None,
                by: str | None = None) -> bool:
    """Pause ``queue``; whether it was being served until now."""
    return operations.pause(conn, queue, reason=reason, by=by)


def resume_queue(conn: Conn, queue: str, *, by: str | None = None) -> bool:
    """Resume ``queue``; whether it was paused until now."""
    return operations.resume(conn, queue, by=by)


def prune(conn: Conn, older_than: float, states: list[str], *, batch: int = 1000) -> int:
    """Delete jobs in ``states`` that finished more than ``older_than`` seconds ago, with
    their attempts and logs, ``batch`` rows a statement (each its own transaction on an
    autocommit connection); returns how many."""
    total = 0
    while True:
        hit = _one(conn, _Deleted, Q.operator_prune, {
            "older_than": timedelta(seconds=older_than), "states": states, "batch": batch})
        deleted = 0 if hit is None or hit.deleted is None else hit.deleted
        total += deleted
        if deleted < batch:
            return total


def log_lines(conn: Conn, job_id: int, attempt: int, *, run: int, after: int = 0,
              limit: int = 1000) -> list[LogLine]:
    """Up to ``limit`` lines of attempt ``attempt`` of run ``run`` written after line id
    ``after``, in order."""
    return _all(conn, LogLine, Q.job_log_lines, {"job_id": job_id, "run": run,
                                                 "attempt": attempt, "after": after,
                                                 "limit": limit})


def latest_log(conn: Conn, job_id: int, *, run: int | None = None) -> tuple[int, int] | None:
    """(run, attempt) of the attempt that wrote the job's newest log line (in run ``run``
    when given), or None when it has none."""
    hit = _one(conn, _Attempt, Q.job_log_attempt, {"job_id": job_id, "run": run})
    return None if hit is None else (hit.run, hit.attempt)


def latest_log_attempt(conn: Conn, job_id: int, *, run: int | None = None) -> int | None:
    """The attempt that wrote the job's newest log line (in run ``run`` when given), or
    None when it has none."""
    hit = latest_log(conn, job_id, run=run)
    return None if hit is None else hit[1]


def run_attempts(conn: Conn, job_id: int, run: int) -> int:
    """How many attempts run ``run`` of a job has had by its timeline and logs (0: none;
    the running attempt is the job row's)."""
    hit = _one(conn, _Attempts, Q.job_run_attempts, {"job_id": job_id, "run": run})
    return 0 if hit is None or hit.attempts is None else hit.attempts


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
    return _all(conn, QueueStats, Q.queue_stats, {"cap": cap, "sample": sample})


def list_workers(conn: Conn) -> list[WorkerRow]:
    """Live supervisors, oldest first."""
    return _all(conn, WorkerRow, Q.worker_list)


def queue_known(conn: Conn, queue: str) -> bool:
    """Whether a declaration, a job, a pause or a live supervisor names ``queue`` (else it is
    probably a typo)."""
    hit = _one(conn, _Known, Q.queue_known, {"queue": queue})
    return hit is not None and hit.known


def queue_served(conn: Conn, queue: str) -> bool:
    """Whether a declaration names ``queue`` or some supervisor has served it."""
    hit = _one(conn, _Known, Q.queue_served, {"queue": queue})
    return hit is not None and hit.known
