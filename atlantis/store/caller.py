"""One statement on the caller's connection, inside the caller's transaction if one is open.

:func:`atlantis.enqueue` and the operations (:func:`atlantis.cancel`, ``retry``, ``pause``,
``resume``) never commit. Inside an open transaction the statement runs under a savepoint,
so that a refused one leaves the caller's transaction usable; with none open, it is the
implicit transaction's only statement, rolled back when it fails (on a connection that does
not autocommit). An error of PostgreSQL's is raised as ``translate`` makes it (an atlantis
error for the SQLSTATEs the caller knows), without the psycopg error chained to it.

Every statement here passes ``prepare=False``: psycopg prepares a statement on the server
once a connection has run it five times (its default ``prepare_threshold``), and the
caller's connection may go through PgBouncer in transaction mode, where the next
transaction can land on a server connection that never saw it ("prepared statement
_pg3_0 does not exist"). The caller's other statements are the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, LiteralString

import psycopg
from psycopg.pq import TransactionStatus

Translate = Callable[[psycopg.Error], BaseException]


def raising(sqlstate: str, error: Callable[[str], BaseException]) -> Translate:
    """A :data:`Translate` that makes the errors of ``sqlstate`` an ``error`` of their
    primary message, and leaves every other as it is."""

    def translate(exc: psycopg.Error) -> BaseException:
        if exc.sqlstate == sqlstate:
            return error(exc.diag.message_primary or str(exc))
        return exc

    return translate


def fetch_one(conn: psycopg.Connection[Any], query: LiteralString, params: dict[str, Any], *,
              translate: Translate) -> tuple[Any, ...] | None:
    """The first row of ``query`` run with ``params`` on ``conn``, as described above."""
    in_tx = conn.info.transaction_status == TransactionStatus.INTRANS
    try:
        if in_tx:
            with conn.transaction():  # a savepoint: never commits the caller's work
                return conn.execute(query, params, prepare=False).fetchone()
        return conn.execute(query, params, prepare=False).fetchone()
    except psycopg.Error as exc:
        if not in_tx and not conn.autocommit and not conn.closed:
            conn.rollback()
        raise translate(exc) from None


async def fetch_one_async(conn: psycopg.AsyncConnection[Any], query: LiteralString,
                          params: dict[str, Any], *,
                          translate: Translate) -> tuple[Any, ...] | None:
    """The twin of :func:`fetch_one` for psycopg's ``AsyncConnection``."""
    in_tx = conn.info.transaction_status == TransactionStatus.INTRANS
    try:
        if in_tx:
            async with conn.transaction():  # a savepoint: never commits the caller's work
                return await (await conn.execute(query, params, prepare=False)).fetchone()
        return await (await conn.execute(query, params, prepare=False)).fetchone()
    except psycopg.Error as exc:
        if not in_tx and not conn.autocommit and not conn.closed:
            await conn.rollback()
        raise translate(exc) from None
