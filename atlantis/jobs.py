"""Jobs read from code: :func:`get_job`, :func:`list_jobs` and :func:`wait`, with their async
twins.

They read the view ``atlantis.job_rows``, which the role ``atlantis_reader`` may read: a
dashboard or a script needs no more. Like the rest of the API they run on the caller's
connection and commit nothing.

:func:`wait` listens on the channel ``atlantis_finished`` before it reads its job's state, so
an end between the two is not missed. The supervisors notify it once per batch of finished
attempts (``finish`` in ``store/queries.sql``: the ids ended, a comma list, or an empty
payload when they do not fit, which every waiter takes as "check yours"); so do a cancel of
a waiting job, a rescue that ends a job and a workflow's halt. Behind a pooler in
transaction mode (PgBouncer) notifications are lost: found out by the pid of the server
process serving it, as the supervisor does, it reads the state every
:data:`POLL_INTERVAL` seconds instead.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing, closing
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import class_row

from atlantis.errors import JobFailedError, JobNotFoundError, ValidationError, WaitTimeout
from atlantis.operations import row_id
from atlantis.store.queries import Q

#: The states a job can be in, and those it never leaves by itself.
STATES = ("available", "running", "complete", "dead", "cancelled")
FINISHED = ("complete", "dead", "cancelled")
#: The channel the jobs' ends are told on.
CHANNEL = "atlantis_finished"
#: Seconds between two reads of the state when notifications cannot be heard (a pooler).
POLL_INTERVAL = 0.5
#: Seconds between two reads of the state while listening: a job ended by a path that
#: notifies nobody (a supervisor giving back at start a row it claimed but never received,
#: cancelled meanwhile; a row the claim cannot take) is seen this late.
RECHECK_INTERVAL = 5.0


@dataclass(frozen=True, slots=True)
class Job:
    """One job as :func:`get_job` and :func:`list_jobs` read it (the view
    ``atlantis.job_rows``; times are the database's, timezone-aware).

    ``state`` is one of ``available``, ``running``, ``complete``, ``dead``, ``cancelled``.
    ``attempt`` counts the attempts of the current ``run`` (1 for a new job, one more after
    each retry), out of ``max_attempts``. ``result`` is the handler's return value once
    ``complete`` (None before). ``last_error`` is the text of the last failure and
    ``error_count`` counts them all. ``workflow_id`` and ``step`` name the workflow step a
    row is (``compensation``: its undo); ``parent_id`` the job whose handler spawned it;
    ``suspended_for`` what a waiting job waits for (``sleep:<step>``, ``event:<event>``,
    ``join:<step>``); ``cancel_requested_at`` and ``cancelled_by`` a cancel asked of a
    running job.
    """

    id: int
    job: str
    queue: str
    args: dict[str, Any]
    state: str
    attempt: int
    max_attempts: int
    priority: int
    run: int
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress_pct: int | None
    progress_msg: str | None
    result: Any
    last_error: str | None
    error_count: int
    workflow_id: int | None
    step: str | None
    compensation: bool
    parent_id: int | None
    suspended_for: str | None
    unique_key: str | None
    cancel_requested_at: datetime | None
    cancelled_by: str | None

    @property
    def finished(self) -> bool:
        """Whether it has ended: ``complete``, ``dead`` or ``cancelled``."""
        return self.state in FINISHED


@dataclass(frozen=True, slots=True)
class _State:
    state: str
    result: Any
    last_error: str | None


def get_job(conn: psycopg.Connection[Any], job_id: int) -> Job | None:
    """The job with this id, or None when no job has it. Raises
    :class:`~atlantis.ValidationError` for an id no job can have (not a ``bigint``)."""
    params = {"id": row_id(job_id)}
    cur = conn.cursor(row_factory=class_row(Job))
    return cur.execute(Q.api_job_get, params, prepare=False).fetchone()


def list_jobs(conn: psycopg.Connection[Any], *, queue: str | None = None,
              state: str | None = None, job: str | None = None, limit: int = 100) -> list[Job]:
    """The newest ``limit`` jobs (highest id first), of ``queue``, in ``state`` and of the
    job type ``job`` when given. Raises :class:`~atlantis.ValidationError` for a state that
    is not a job's or a ``limit`` that is not a whole number from 0 to a ``bigint``."""
    params = _filters(queue, state, job, limit)
    cur = conn.cursor(row_factory=class_row(Job))
    return cur.execute(Q.api_job_list, params, prepare=False).fetchall()


async def get_job_async(conn: psycopg.AsyncConnection[Any], job_id: int) -> Job | None:
    """The twin of :func:`get_job` for psycopg's ``AsyncConnection``."""
    params = {"id": row_id(job_id)}
    cur = conn.cursor(row_factory=class_row(Job))
    await cur.execute(Q.api_job_get, params, prepare=False)
    return await cur.fetchone()


async def list_jobs_async(conn: psycopg.AsyncConnection[Any], *, queue: str | None = None,
                          state: str | None = None, job: str | None = None,
                          limit: int = 100) -> list[Job]:
    """The twin of :func:`list_jobs` for psycopg's ``AsyncConnection``."""
    params = _filters(queue, state, job, limit)
    cur = conn.cursor(row_factory=class_row(Job))
    await cur.execute(Q.api_job_list, params, prepare=False)
    return await cur.fetchall()


def _filters(queue: str | None, state: str | None, job: str | None,
             limit: int) -> dict[str, Any]:
    if state is not None and state not in STATES:
        raise ValidationError(f"state: {state!r} is not a job's state "
                              f"(one of {', '.join(STATES)})")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**63:
        raise ValidationError(f"limit: expected a whole number from 0 to {2**63 - 1}, "
                              f"not {limit!r}")
    return {"queue": queue, "state": state, "job": job, "limit": limit}


# ---- wait ------------------------------------------------------------------------------

_PENDING = object()


def wait(conn_or_url: str | psycopg.Connection[Any], job_id: int,
         timeout: float | None = None) -> Any:
    """Wait until job ``job_id`` ends; return its result once it is ``complete``.

    ``conn_or_url`` is a database URL (a connection of its own is opened and closed) or a
    connection with no transaction open (commit the enqueue first: until then no
    supervisor sees the job); it is put in autocommit mode while waiting, listens on the
    channel ``atlantis_finished`` and unlistens at the end (notifications of other
    channels that reach it meanwhile are dropped). ``timeout``: at most that many seconds
    (None: as long as it takes).

    Raises :class:`~atlantis.JobFailedError` (with ``job_id``, ``state``, ``last_error``)
    when it ends ``dead`` or ``cancelled``, :class:`~atlantis.WaitTimeout` (a
    :class:`TimeoutError`) when ``timeout`` passes first (the job goes on),
    :class:`~atlantis.JobNotFoundError` for an unknown id, and
    :class:`~atlantis.ValidationError` for an id no job can have, a negative ``timeout``
    or a connection inside a transaction. Behind PgBouncer in transaction mode it reads
    the job's state every half second instead of listening.
    """
    row_id(job_id)
    deadline = _deadline(timeout)
    if isinstance(conn_or_url, str):
        with psycopg.connect(conn_or_url, autocommit=True, prepare_threshold=None) as own:
            return _wait_on(own, job_id, timeout, deadline)
    conn = conn_or_url
    _check_idle(conn.info.transaction_status)
    was = conn.autocommit
    conn.autocommit = True
    try:
        return _wait_on(conn, job_id, timeout, deadline)
    finally:
        if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            conn.autocommit = was


def _wait_on(conn: psycopg.Connection[Any], job_id: int, timeout: float | None,
             deadline: float | None) -> Any:
    listening = not _behind_pooler(conn.execute(Q.backend_pid, prepare=False).fetchone(),
                                   conn.info.backend_pid)
    if listening:
        conn.execute(Q.wait_listen, prepare=False)
    try:
        while True:
            row = conn.cursor(row_factory=class_row(_State)).execute(
                Q.wait_state, {"id": job_id}, prepare=False).fetchone()
            outcome = _outcome(row, job_id)
            if outcome is not _PENDING:
                return outcome
            left = _left(deadline, job_id, timeout)
            if not listening:
                time.sleep(min(left, POLL_INTERVAL))
                continue
            heard = False
            with closing(conn.notifies(timeout=min(left, RECHECK_INTERVAL))) as notes:
                for note in notes:
                    if _names(note, job_id):
                        heard = True
                        break
            if not heard:
                _left(deadline, job_id, timeout)  # told nothing until the deadline: timed out
    finally:
        if listening and not conn.closed and not conn.broken:
            conn.execute(Q.wait_unlisten, prepare=False)


async def wait_async(conn_or_url: str | psycopg.AsyncConnection[Any], job_id: int,
                     timeout: float | None = None) -> Any:
    """The twin of :func:`wait` for psycopg's ``AsyncConnection`` (or a URL)."""
    row_id(job_id)
    deadline = _deadline(timeout)
    if isinstance(conn_or_url, str):
        own = await psycopg.AsyncConnection.connect(conn_or_url, autocommit=True,
                                                    prepare_threshold=None)
        async with own:
            return await _wait_on_async(own, job_id, timeout, deadline)
    conn = conn_or_url
    _check_idle(conn.info.transaction_status)
    was = conn.autocommit
    await conn.set_autocommit(True)
    try:
        return await _wait_on_async(conn, job_id, timeout, deadline)
    finally:
        if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            await conn.set_autocommit(was)


async def _wait_on_async(conn: psycopg.AsyncConnection[Any], job_id: int,
                         timeout: float | None, deadline: float | None) -> Any:
    pid = await (await conn.execute(Q.backend_pid, prepare=False)).fetchone()
    listening = not _behind_pooler(pid, conn.info.backend_pid)
    if listening:
        await conn.execute(Q.wait_listen, prepare=False)
    try:
        while True:
            cur = conn.cursor(row_factory=class_row(_State))
            await cur.execute(Q.wait_state, {"id": job_id}, prepare=False)
            outcome = _outcome(await cur.fetchone(), job_id)
            if outcome is not _PENDING:
                return outcome
            left = _left(deadline, job_id, timeout)
            if not listening:
                await asyncio.sleep(min(left, POLL_INTERVAL))
                continue
            heard = False
            async with aclosing(conn.notifies(timeout=min(left, RECHECK_INTERVAL))) as notes:
                async for note in notes:
                    if _names(note, job_id):
                        heard = True
                        break
            if not heard:
                _left(deadline, job_id, timeout)
    finally:
        if listening and not conn.closed and not conn.broken:
            await conn.execute(Q.wait_unlisten, prepare=False)


def _deadline(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise ValidationError(f"timeout: expected seconds, 0 or more, or None, not {timeout!r}")
    return time.monotonic() + timeout


def _check_idle(status: TransactionStatus) -> None:
    if status != TransactionStatus.IDLE:
        raise ValidationError(
            "wait needs a connection with no transaction open: commit (or roll back) first; "
            "a job enqueued in an open transaction is seen by no supervisor until it commits")


def _behind_pooler(row: tuple[Any, ...] | None, told: int) -> bool:
    """Whether the server process serving the statement (``row``: ``pg_backend_pid()``) is
    not the one the connection was told at start: a pooler hands out its own keys."""
    return row is None or row[0] != told


def _outcome(row: _State | None, job_id: int) -> Any:
    """The job's result once complete, :data:`_PENDING` while it has not ended."""
    if row is None:
        raise JobNotFoundError(f"no job with id {job_id}")
    if row.state == "complete":
        return row.result
    if row.state in FINISHED:
        raise JobFailedError(job_id, row.state, row.last_error)
    return _PENDING


def _left(deadline: float | None, job_id: int, timeout: float | None) -> float:
    """Seconds left before ``deadline``; :class:`WaitTimeout` once none are."""
    if deadline is None:
        return RECHECK_INTERVAL
    left = deadline - time.monotonic()
    if left <= 0:
        raise WaitTimeout(f"job {job_id} had not ended after {timeout:g}s")
    return left


def _names(note: psycopg.Notify, job_id: int) -> bool:
    """Whether ``note`` may tell of ``job_id``'s end: its id in the list, or an empty list
    (too many to name)."""
    if note.channel != CHANNEL:
        return False
    return not note.payload or str(job_id) in note.payload.split(",")
