"""Enqueue jobs on the caller's connection, inside the caller's transaction.

The rows are written by ``atlantis.enqueue_many`` in SQL, which validates the arguments
against the declarations stored in the database: the same rules as for SQL callers and
``tide job enqueue``. These functions never commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from atlantis.errors import UnknownJobError, ValidationError
from atlantis.store.queries import Q

UNKNOWN_JOB = "ATL01"
INVALID_ARGS = "ATL02"


def _params(
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    delay: float | timedelta | None,
    run_at: datetime | None,
    priority: int | None,
    queue: str | None,
) -> dict[str, Any]:
    if isinstance(delay, int | float):
        delay = timedelta(seconds=delay)
    return {
        "job": job,
        "args": [Jsonb(dict(a)) for a in args_list],
        "run_at": run_at,
        "priority": priority,
        "queue": queue,
        "delay": delay,
    }


def _translate(exc: psycopg.Error) -> BaseException:
    diag = exc.diag
    message = diag.message_primary or str(exc)
    if exc.sqlstate == UNKNOWN_JOB:
        hint = f"; {diag.message_hint}" if diag.message_hint else ""
        return UnknownJobError(message + hint)
    if exc.sqlstate == INVALID_ARGS:
        return ValidationError(message)
    return exc


def _ids(row: tuple[Any, ...] | None) -> list[int]:
    assert row is not None
    return list(row[0])


def enqueue_many(
    conn: psycopg.Connection[Any],
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    *,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
) -> list[int]:
    """Insert one row per args in one round trip; returns the ids in order.

    A refused batch writes nothing (it is one statement) and leaves the caller's
    transaction usable: inside an open transaction a savepoint undoes the statement; with
    none open, the implicit transaction that held only this statement is rolled back.
    """
    params = _params(job, args_list, delay, run_at, priority, queue)
    in_tx = conn.info.transaction_status == TransactionStatus.INTRANS
    try:
        if in_tx:
            with conn.transaction():  # a savepoint: never commits the caller's work
                return _ids(conn.execute(Q.enqueue_many, params).fetchone())
        return _ids(conn.execute(Q.enqueue_many, params).fetchone())
    except psycopg.Error as exc:
        if not in_tx and not conn.autocommit and not conn.closed:
            conn.rollback()
        raise _translate(exc) from None


def enqueue(
    conn: psycopg.Connection[Any],
    job: str,
    args: Mapping[str, Any] | None = None,
    *,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
) -> int:
    """Enqueue one job; returns its id. Visible to workers when the caller commits."""
    return enqueue_many(
        conn, job, [args or {}], delay=delay, run_at=run_at, priority=priority, queue=queue
    )[0]


async def enqueue_many_async(
    conn: psycopg.AsyncConnection[Any],
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    *,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
) -> list[int]:
    """The twin of :func:`enqueue_many` for psycopg's ``AsyncConnection``."""
    params = _params(job, args_list, delay, run_at, priority, queue)
    in_tx = conn.info.transaction_status == TransactionStatus.INTRANS
    try:
        if in_tx:
            async with conn.transaction():
                cur = await conn.execute(Q.enqueue_many, params)
                return _ids(await cur.fetchone())
        cur = await conn.execute(Q.enqueue_many, params)
        return _ids(await cur.fetchone())
    except psycopg.Error as exc:
        if not in_tx and not conn.autocommit and not conn.closed:
            await conn.rollback()
        raise _translate(exc) from None


async def enqueue_async(
    conn: psycopg.AsyncConnection[Any],
    job: str,
    args: Mapping[str, Any] | None = None,
    *,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
) -> int:
    """The twin of :func:`enqueue` for psycopg's ``AsyncConnection``."""
    ids = await enqueue_many_async(
        conn, job, [args or {}], delay=delay, run_at=run_at, priority=priority, queue=queue
    )
    return ids[0]
