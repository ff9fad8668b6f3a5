"""Operators' orders to one supervisor: drain, evict, resume (issue 37, migration 0032).

The statements are ``orders.sql``'s, the functions live/workers.sql's. An order is kept by
the supervisor's *name* (``--name``), so that a drained supervisor stays drained across its
own restarts until it is resumed; the supervisor's side is
:mod:`atlantis.supervisor.orders`. Nothing here commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from atlantis.errors import AtlantisError
from atlantis.store import caller
from atlantis.store.queries import Q
from atlantis.store.supervision import Connection
from atlantis.store.typed_rows import all_rows

Conn = psycopg.Connection[Any]

#: SQLSTATE of a refused order (an unknown supervisor, one that takes no orders).
REFUSED = "ATL30"


class WorkerOrderError(AtlantisError):
    """An order no supervisor can take: an unknown id or name, or a release without orders."""


@dataclass(frozen=True, slots=True)
class Ordered:
    """The supervisor an order reached, as the order found it."""

    id: str
    name: str
    silent: bool
    in_flight: int


@dataclass(frozen=True, slots=True)
class StandingOrder:
    """An order kept for a supervisor name until ``tide worker resume``."""

    name: str
    worker_id: str
    action: str
    exit_when_drained: bool
    asked_by: str
    asked_at: datetime
    drained_at: datetime | None


_errors = caller.raising(REFUSED, WorkerOrderError)


def order(conn: Conn, worker: str, action: str, *, exit_when_drained: bool = False,
          by: str | None = None) -> Ordered:
    """Order the supervisor ``worker`` (its id or its name) to ``drain`` or be ``evict``-ed;
    raises :class:`WorkerOrderError` when no supervisor can take it."""
    row = caller.fetch_one(conn, Q.worker_order, {"worker": worker, "action": action,
                                                   "exit": exit_when_drained, "by": by},
                           translate=_errors)
    assert row is not None
    return Ordered(id=str(row[0]), name=str(row[1]), silent=bool(row[2]),
                   in_flight=int(row[3] or 0))


def resume(conn: Conn, worker: str, *, by: str | None = None) -> str | None:
    """Lift the order of ``worker`` (an id, a name, or the id an order was given to): the
    name whose order was lifted, None when it had none. :class:`WorkerOrderError` when
    nothing has that id or name."""
    row = caller.fetch_one(conn, Q.worker_resume, {"worker": worker, "by": by},
                           translate=_errors)
    return None if row is None or row[0] is None else str(row[0])


def standing_orders(conn: Conn) -> list[StandingOrder]:
    """Every order in force, by supervisor name."""
    return all_rows(conn, StandingOrder, Q.worker_orders)


# ---- the supervisor's statements ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MyOrder:
    """The order a supervisor run is under: ``drain`` or ``evict``; ``exit_when_drained``
    only for the run it was given to."""

    action: str
    exit_when_drained: bool


async def adopt(db: Connection, worker: str, name: str) -> MyOrder | None:
    """At start: the order kept for ``name``, now this run's (its exit is not)."""
    rows = await db.fetch(Q.worker_order_adopt, {"id": worker, "name": name}, timeout=5)
    return MyOrder(str(rows[0][0]), bool(rows[0][1])) if rows else None


async def read(db: Connection, worker: str, name: str) -> MyOrder | None:
    """The order this run is under now, None when it may claim."""
    rows = await db.fetch(Q.worker_order_read, {"id": worker, "name": name}, timeout=5)
    return MyOrder(str(rows[0][0]), bool(rows[0][1])) if rows else None


async def drained(db: Connection, name: str, action: str) -> None:
    """Record that nothing is in flight any more under the order ``action``."""
    await db.fetch(Q.worker_order_drained, {"name": name, "action": action}, timeout=5)
