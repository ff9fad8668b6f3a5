"""Enqueue inside a SQLAlchemy 2 transaction: a ``Session``'s, or a ``Connection``'s.

::

    from sqlalchemy.orm import Session
    from atlantis.integrations import sqlalchemy as jobs

    with Session(engine) as session, session.begin():
        session.add(order)
        session.flush()
        jobs.enqueue(session, "shop.SendReceipt", {"order_id": order.id})

The job's row is written on the connection the session (or the ``Connection`` given)
holds, in its transaction, which this begins if it has not yet: supervisors see the job
when that transaction commits, never before, and a rollback (``session.rollback()``, or an
exception leaving ``session.begin()``) takes the job with it. A refused call (an unknown
job, bad args) raises the atlantis error and leaves the transaction usable, with all that
was done in it (a savepoint undoes the one statement). ``AsyncSession`` and
``AsyncConnection`` have the ``*_async`` twins (SQLAlchemy's asyncio needs ``greenlet``:
``pip install 'sqlalchemy[asyncio]'``).

There is no ``after_commit`` variant, on purpose: a job enqueued from a commit hook is
written after the commit, so a crash or a lost connection between the two loses it while
the order it was for stays. Written in the transaction, the job and the order commit
together or not at all.

The engine must use the psycopg 3 dialect (``postgresql+psycopg://``; for asyncio
``create_async_engine`` with the same URL). Another database, or another driver
(psycopg2, asyncpg, pg8000), is refused with a :class:`~atlantis.ConfigurationError`.
Everything atlantis sends on this connection is never prepared, so it goes through
PgBouncer in transaction mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, Unpack

import psycopg
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import Session, scoped_session

import atlantis
from atlantis.enqueue import EnqueueOptions
from atlantis.errors import ConfigurationError
from atlantis.integrations.common import check_not_aborted

if TYPE_CHECKING:  # sqlalchemy.ext.asyncio needs greenlet, which sync users may not have
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

Bind: TypeAlias = "Session | scoped_session[Any] | Connection"
AsyncBind: TypeAlias = "AsyncSession | async_scoped_session[Any] | AsyncConnection"


def _check(dialect: Dialect, raw: object, wanted: type) -> None:
    if dialect.name != "postgresql":
        raise ConfigurationError(
            f"SQLAlchemy dialect {dialect.name}+{dialect.driver}: atlantis needs PostgreSQL "
            "through psycopg 3 (postgresql+psycopg://)")
    if not isinstance(raw, wanted):
        raise ConfigurationError(
            f"SQLAlchemy dialect postgresql+{dialect.driver}: atlantis needs the psycopg 3 "
            "driver (a URL starting postgresql+psycopg://)")


def connection(bind: Bind) -> psycopg.Connection[Any]:
    """The psycopg 3 connection under a ``Session`` or ``Connection``, its transaction begun.

    For any call of the public API that has no helper here:
    ``atlantis.retry(connection(session), job_id)``.
    """
    conn = bind if isinstance(bind, Connection) else bind.connection()
    raw = conn.connection.driver_connection
    _check(conn.dialect, raw, psycopg.Connection)
    assert isinstance(raw, psycopg.Connection)
    check_not_aborted(raw, "SQLAlchemy connection")
    if not conn.in_transaction():
        # Commit-as-you-go: begin as the first execute would, so that conn.commit()
        # commits what atlantis writes (it would be a no-op with no transaction begun).
        conn.begin()
    return raw


async def async_connection(bind: AsyncBind) -> psycopg.AsyncConnection[Any]:
    """The twin of :func:`connection` for ``AsyncSession`` and ``AsyncConnection``."""
    from sqlalchemy.ext.asyncio import AsyncConnection

    conn = bind if isinstance(bind, AsyncConnection) else await bind.connection()
    raw = (await conn.get_raw_connection()).driver_connection
    _check(conn.dialect, raw, psycopg.AsyncConnection)
    assert isinstance(raw, psycopg.AsyncConnection)
    check_not_aborted(raw, "SQLAlchemy connection")
    if not conn.in_transaction():
        await conn.begin()
    return raw


def enqueue(
    bind: Bind,
    job: str,
    args: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> int:
    """:func:`atlantis.enqueue` in the transaction of ``bind``; returns the job's id."""
    return atlantis.enqueue(connection(bind), job, args, **options)


def enqueue_many(
    bind: Bind,
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    **options: Unpack[EnqueueOptions],
) -> list[int]:
    """:func:`atlantis.enqueue_many` in the transaction of ``bind``; the ids in order."""
    return atlantis.enqueue_many(connection(bind), job, args_list, **options)


def start_workflow(bind: Bind, name: str, args: Mapping[str, Any] | None = None) -> int:
    """:func:`atlantis.start_workflow` in the transaction of ``bind``; its id."""
    return atlantis.start_workflow(connection(bind), name, args)


def cancel(bind: Bind, job_id: int, *, by: str | None = None) -> str | None:
    """:func:`atlantis.cancel` in the transaction of ``bind``: done when it commits."""
    return atlantis.cancel(connection(bind), job_id, by=by)


async def enqueue_async(
    bind: AsyncBind,
    job: str,
    args: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> int:
    """:func:`atlantis.enqueue_async` in the transaction of ``bind``; the job's id."""
    return await atlantis.enqueue_async(await async_connection(bind), job, args, **options)


async def enqueue_many_async(
    bind: AsyncBind,
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    **options: Unpack[EnqueueOptions],
) -> list[int]:
    """:func:`atlantis.enqueue_many_async` in the transaction of ``bind``; the ids."""
    return await atlantis.enqueue_many_async(await async_connection(bind), job, args_list, **options)


async def start_workflow_async(bind: AsyncBind, name: str,
                               args: Mapping[str, Any] | None = None) -> int:
    """:func:`atlantis.start_workflow_async` in the transaction of ``bind``; its id."""
    return await atlantis.start_workflow_async(await async_connection(bind), name, args)
