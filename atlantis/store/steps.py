"""Handler steps in the database (issue 34, migration 0026): the statements a run's child
sends on its handler's own connection, and the operators' reads.

Every write is fenced on the run (``atlantis.step_fence``, live/steps.sql). The errors of
the fence are told apart by SQLSTATE: :data:`LEASE_LOST` (this run no longer holds the
job: another may), :data:`NO_SUCH_JOB` (the handler's database is not the jobs').
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus

from atlantis.protocol.fence import Fence as Fence  # the store names the fence it checks
from atlantis.store.queries import Q
from atlantis.store.typed_rows import all_rows, one_row

IDLE = TransactionStatus.IDLE

#: SQLSTATE of a fenced write or read whose run no longer holds the job's lease.
LEASE_LOST = "ATL20"
#: SQLSTATE of a step call naming a job this database does not hold.
NO_SUCH_JOB = "ATL21"

#: Open options of a handler's step connection: autocommit (a plain step's record is its
#: own transaction: one commit), nothing prepared until :func:`open_records` found it goes
#: straight to PostgreSQL (PgBouncer in transaction mode has no prepared statements).
CONNECT_OPTIONS: dict[str, Any] = {"autocommit": True, "prepare_threshold": None,
                                   "application_name": "atlantis handler steps"}
#: Executions of a statement before psycopg prepares it (its default), on a direct connection:
#: a transaction step's own statements (a page's upserts) are then planned once.
PREPARE_THRESHOLD = 5


#: A child's step connection, kept between its attempts (by URL, with the process that made
#: it): a new backend pays for the catalog of atlantis.jobs at its first statement, every
#: attempt would otherwise pay it again.
_KEPT: dict[str, tuple[int, psycopg.Connection[Any]]] = {}


def open_run(url: str, fence: Fence) -> tuple[psycopg.Connection[Any], Opened]:
    """A run's step connection and what its first step reads (:func:`open_records`): the
    connection an earlier attempt of this process left, if it is still open and idle and the
    server still has it, else a new one."""
    kept = _KEPT.pop(url, None)
    if kept is not None:
        pid, conn = kept
        if pid == os.getpid() and not conn.closed and conn.info.transaction_status == IDLE:
            try:
                return conn, open_records(conn, fence)
            except psycopg.OperationalError:  # dropped by the server meanwhile
                pass
        _close(conn)
    conn = psycopg.connect(url, **CONNECT_OPTIONS)
    try:
        return conn, open_records(conn, fence)
    except BaseException:
        _close(conn)
        raise


def keep(url: str, conn: psycopg.Connection[Any]) -> None:
    """After an attempt: reset ``conn``'s session and keep it for this process's next attempt;
    one that is not idle, or whose reset fails, is closed instead."""
    try:
        if conn.closed or conn.info.transaction_status != IDLE:
            raise psycopg.InterfaceError("not idle")
        conn.execute(Q.step_session_reset, prepare=False)
    except psycopg.Error:
        _close(conn)
        return
    old = _KEPT.pop(url, None)
    if old is not None:
        _close(old[1])
    _KEPT[url] = (os.getpid(), conn)


def _close(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except Exception:  # a connection of another process, or already broken
        pass


@dataclass(frozen=True, slots=True)
class Opened:
    """What a run's first step reads: whether the run holds the job (``held``: ``ok``,
    ``lost``, or ``missing`` when this database has no such job) and every record."""

    held: str
    rows: list[tuple[str, str, str]]


def _opened(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
            found: list[tuple[Any, ...]]) -> Opened:
    head = next((r for r in found if r[0] is None), None)
    held = head[1] if head else "missing"
    # A pooler hands its client a pid of its own: the server process behind it changes.
    if head is not None and head[2] == str(conn.info.backend_pid):
        conn.prepare_threshold = PREPARE_THRESHOLD
    return Opened(held, [(r[0], r[1], r[2]) for r in found if r[0] is not None])


def _params(fence: Fence, **more: Any) -> dict[str, Any]:
    return {"job_id": fence.job_id, "run_id": UUID(fence.run_id), "attempt": fence.attempt,
            **more}


# ---- the child's side (sync and async twins; the rules are the caller's) ----------------

def open_records(conn: psycopg.Connection[Any], fence: Fence) -> Opened:
    """Every record of the job, ``(name, kind, value as JSON text)``, whether the run holds
    it, and (one round trip in all) whether ``conn`` may prepare: not through a pooler."""
    return _opened(conn, conn.execute(Q.step_records, _params(fence)).fetchall())


def record(conn: psycopg.Connection[Any], fence: Fence, name: str, kind: str,
           value: str) -> None:
    """Record a step (its own transaction); raises :data:`LEASE_LOST` when the run no longer
    holds the job (nothing recorded)."""
    conn.execute(Q.step_record, _params(fence, name=name, kind=kind, value=value))


class StepTransaction:
    """A transaction step's transaction on the run's connection: psycopg's transaction
    block (``fn`` may nest savepoints in it, and may not commit or roll it back itself),
    ended by :meth:`commit` in one round trip: the step's record, whose fence raises
    :data:`LEASE_LOST` when the run no longer holds the job, and COMMIT, pipelined. A record
    that fails aborts the transaction on the server, so its COMMIT never runs; the
    transaction is then rolled back and the error raised. An error ending the block before
    :meth:`commit` rolls it back as psycopg does."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._tx = conn.transaction()
        self._ended = False

    def __enter__(self) -> StepTransaction:
        self._tx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False if self._ended else bool(self._tx.__exit__(*exc))

    def commit(self, fence: Fence, name: str, kind: str, value: str) -> None:
        """Record the step and COMMIT, or raise (an ``OperationalError``: the connection
        failed, and whether it committed is unknown)."""
        self._ended = True
        conn = self._conn
        try:
            with conn.pipeline():
                conn.execute(Q.step_record, _params(fence, name=name, kind=kind, value=value))
                self._tx.__exit__(None, None, None)  # COMMIT, queued behind the record
        except BaseException as exc:
            _give_up(conn)
            cause = _cause(exc)
            if cause is exc:
                raise
            raise cause from None


def _cause(exc: BaseException) -> BaseException:
    """What the end of a step failed on. For a ``PipelineAborted``: the record's own error
    (the fence's :data:`LEASE_LOST`, say), which psycopg may raise first or, when the
    COMMIT's aborted result is fetched while that error is raised, leave as the context of
    its ``PipelineAborted`` (which, an ``OperationalError``, would read as a connection that
    failed during COMMIT). The COMMIT never ran behind a failed record: nothing committed.
    ``exc`` itself otherwise."""
    if not isinstance(exc, psycopg.errors.PipelineAborted):
        return exc
    seen: BaseException | None = exc.__context__
    while seen is not None:
        if isinstance(seen, psycopg.Error) and not isinstance(seen, psycopg.OperationalError):
            return seen
        seen = seen.__context__
    return exc


def _give_up(conn: psycopg.Connection[Any]) -> None:
    """Roll back what a failed end of a step left open, if the connection still can."""
    if not conn.closed and conn.info.transaction_status != IDLE:
        try:
            conn.rollback()
        except psycopg.Error:
            pass


def sleep(conn: psycopg.Connection[Any], fence: Fence, name: str, seconds: float | None,
          until: datetime | None) -> tuple[datetime, bool]:
    row = conn.execute(Q.step_sleep, _params(fence, name=name, seconds=seconds,
                                             until=until)).fetchone()
    assert row is not None
    return row[0], bool(row[1])


async def open_records_async(conn: psycopg.AsyncConnection[Any], fence: Fence) -> Opened:
    """:func:`open_records` on an async connection."""
    cur = await conn.execute(Q.step_records, _params(fence))
    return _opened(conn, await cur.fetchall())


def wait_event(conn: psycopg.Connection[Any], fence: Fence, name: str, event: str,
               seconds: float | None) -> tuple[bool, str | None, datetime | None]:
    """A wait's step (``atlantis.step_wait_event``): (delivered, its payload as JSON text, the
    wake time while it waits: None once delivered or timed out)."""
    row = conn.execute(Q.step_wait_event, _params(fence, name=name, event=event,
                                                  seconds=seconds)).fetchone()
    assert row is not None
    return bool(row[0]), row[1], row[2]


async def wait_event_async(conn: psycopg.AsyncConnection[Any], fence: Fence, name: str,
                           event: str, seconds: float | None
                           ) -> tuple[bool, str | None, datetime | None]:
    """:func:`wait_event` on an async connection."""
    cur = await conn.execute(Q.step_wait_event, _params(fence, name=name, event=event,
                                                        seconds=seconds))
    row = await cur.fetchone()
    assert row is not None
    return bool(row[0]), row[1], row[2]


async def record_async(conn: psycopg.AsyncConnection[Any], fence: Fence, name: str,
                       kind: str, value: str) -> None:
    """:func:`record` on an async connection."""
    await conn.execute(Q.step_record, _params(fence, name=name, kind=kind, value=value))


class AsyncStepTransaction:
    """:class:`StepTransaction` on an async connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        self._tx = conn.transaction()
        self._ended = False

    async def __aenter__(self) -> AsyncStepTransaction:
        await self._tx.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool:
        return False if self._ended else bool(await self._tx.__aexit__(*exc))

    async def commit(self, fence: Fence, name: str, kind: str, value: str) -> None:
        """:meth:`StepTransaction.commit`."""
        self._ended = True
        conn = self._conn
        try:
            async with conn.pipeline():
                await conn.execute(Q.step_record,
                                   _params(fence, name=name, kind=kind, value=value))
                await self._tx.__aexit__(None, None, None)
        except BaseException as exc:
            await _give_up_async(conn)
            cause = _cause(exc)
            if cause is exc:
                raise
            raise cause from None


async def _give_up_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`_give_up` on an async connection."""
    if not conn.closed and conn.info.transaction_status != IDLE:
        try:
            await conn.rollback()
        except psycopg.Error:
            pass


async def sleep_async(conn: psycopg.AsyncConnection[Any], fence: Fence, name: str,
                      seconds: float | None, until: datetime | None) -> tuple[datetime, bool]:
    cur = await conn.execute(Q.step_sleep, _params(fence, name=name, seconds=seconds,
                                                   until=until))
    row = await cur.fetchone()
    assert row is not None
    return row[0], bool(row[1])


def spawn(conn: psycopg.Connection[Any], fence: Fence, name: str,
          params: dict[str, Any]) -> tuple[int, bool]:
    """A spawn's step (``atlantis.step_spawn``): (the job's id, whether it is a new child)."""
    row = conn.execute(Q.step_spawn, _params(fence, name=name, **params)).fetchone()
    assert row is not None
    return int(row[0]), bool(row[1])


async def spawn_async(conn: psycopg.AsyncConnection[Any], fence: Fence, name: str,
                      params: dict[str, Any]) -> tuple[int, bool]:
    """:func:`spawn` on an async connection."""
    cur = await conn.execute(Q.step_spawn, _params(fence, name=name, **params))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), bool(row[1])


def spawn_many(conn: psycopg.Connection[Any], fence: Fence, name: str,
               params: dict[str, Any]) -> list[tuple[int, bool]]:
    """A batch spawn (``atlantis.step_spawn_many``): (id, new child?) per args, in order."""
    rows = conn.execute(Q.step_spawn_many, _params(fence, name=name, **params)).fetchall()
    return [(int(r[0]), bool(r[1])) for r in rows]


async def spawn_many_async(conn: psycopg.AsyncConnection[Any], fence: Fence, name: str,
                           params: dict[str, Any]) -> list[tuple[int, bool]]:
    """:func:`spawn_many` on an async connection."""
    cur = await conn.execute(Q.step_spawn_many, _params(fence, name=name, **params))
    return [(int(r[0]), bool(r[1])) for r in await cur.fetchall()]


def join(conn: psycopg.Connection[Any], fence: Fence, name: str, ids: list[int],
         results: bool) -> list[tuple[Any, ...]]:
    """A join's step (``atlantis.step_join``): its rows, the first saying whether every job
    has ended ('ended', then one row per id) or not ('waiting')."""
    return conn.execute(Q.step_join, _params(fence, name=name, ids=ids, results=results)
                        ).fetchall()


async def join_async(conn: psycopg.AsyncConnection[Any], fence: Fence, name: str,
                     ids: list[int], results: bool) -> list[tuple[Any, ...]]:
    """:func:`join` on an async connection."""
    cur = await conn.execute(Q.step_join, _params(fence, name=name, ids=ids, results=results))
    return await cur.fetchall()


# ---- operators ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepRow:
    name: str
    kind: str
    value: str
    bytes: int
    attempt: int
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class StepSummary:
    records: int
    bytes: int
    last: list[dict[str, Any]]
    """The last few records, oldest first: name, kind, bytes, at."""


def step_list(conn: psycopg.Connection[Any], job_id: int, limit: int = 100_000) -> list[StepRow]:
    return all_rows(conn, StepRow, Q.step_list, {"job_id": job_id, "limit": limit})


def step_summary(conn: psycopg.Connection[Any], job_id: int, last: int = 5) -> StepSummary:
    row = one_row(conn, StepSummary, Q.step_summary, {"job_id": job_id, "last": last})
    assert row is not None
    return row


@dataclass(frozen=True, slots=True)
class Suspension:
    """What a suspended (``available``) job waits for, ``sleep:<step>``, and until when."""

    suspended_for: str
    until: datetime


def children(conn: psycopg.Connection[Any], job_id: int) -> dict[str, int]:
    """A job's children (jobs its handler spawned) by state; empty when it has none."""
    return {str(r[0]): int(r[1])
            for r in conn.execute(Q.job_children, {"job_id": job_id}).fetchall()}


def clear(conn: psycopg.Connection[Any], job_id: int) -> int:
    row = conn.execute(Q.step_clear, {"job_id": job_id}).fetchone()
    return int(row[0]) if row is not None else 0
