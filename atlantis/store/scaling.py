"""The scaling signal (issue 37) as typed rows: per queue what an autoscaler and an alert
need, read from the database alone (``atlantis.queue_signal``, ``live/signal.sql``), so that
a process that runs no job can serve it: ``tide queue signal``, ``tide metrics serve``, the
console's ``/metrics``. The statements are ``scaling.sql``'s; nothing here commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from atlantis.store.queries import Q
from atlantis.store.typed_rows import all_rows, one_row


@dataclass(frozen=True, slots=True)
class QueueSignal:
    """One queue. Its waiting rows, each in one part: ``claimable`` (due now, and free to
    be claimed: no limit holds it), ``limit_held`` (due, but a concurrency or rate limit has
    no room for it), ``delayed`` (waiting for a later time) and ``suspended`` (a durable
    sleep or wait, not over yet); ``running``; ``oldest_claimable_seconds``: how long the
    oldest claimable row has been due (None: none is). A ``paused`` queue has nothing
    claimable and nothing held. Each count is exact up to 1,000 rows and estimated beyond
    (``exact`` false)."""

    queue: str
    claimable: int
    oldest_claimable_seconds: float | None
    running: int
    delayed: int
    limit_held: int
    suspended: int
    paused: bool
    exact: bool


@dataclass(frozen=True, slots=True)
class Fleet:
    """The supervisors as a scrape sees them: how many are silent, and how many supervisor
    names an operator's order holds (``drained``: ``tide worker drain``; ``evicted``:
    ``tide worker evict``), until resumed."""

    silent: int
    drained: int
    evicted: int


NO_FLEET = Fleet(silent=0, drained=0, evicted=0)


def queue_signal(conn: psycopg.Connection[Any], queue: str | None = None) -> list[QueueSignal]:
    """The signal of ``queue`` (one row, zeros for a queue nothing names), or of every queue
    a declaration, a pause or limit, a live supervisor or a waiting or running job names,
    by name."""
    return all_rows(conn, QueueSignal, Q.queue_signal, {"queue": queue})


def fleet(conn: psycopg.Connection[Any]) -> Fleet:
    """How many supervisors are silent (not seen for two of their liveness intervals) among
    those ``tide worker list`` shows, and how many names an order holds drained or evicted."""
    return one_row(conn, Fleet, Q.workers_silent) or NO_FLEET
