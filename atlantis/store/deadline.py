"""Deadlines for commands a person (or cron) runs: ``tide`` never hangs on a database that
accepted the connection and then went silent (a stopped server, a silent TCP peer).

The supervisor has its own, asynchronous, deadlines (:mod:`atlantis.supervisor.db`); these
are for the blocking connections of operator commands.
"""

from __future__ import annotations

import math
from typing import Any

import psycopg

#: How long an operator's command waits for the database by default: to connect, and for
#: each statement (``tide --timeout``, ``ATLANTIS_TIDE_TIMEOUT``).
CONNECT_DEADLINE = 5.0
STATEMENT_DEADLINE = 30.0
#: After a statement's deadline, how long to wait for the server to confirm the cancel.
_CANCEL_WAIT = 2.0
#: libpq's (and psycopg's) shortest connect timeout: whole seconds, at least 2.
_MIN_CONNECT_TIMEOUT = 2


def connect_timeout(seconds: float) -> int:
    """The ``connect_timeout`` libpq applies for a deadline of ``seconds`` (0: none)."""
    if seconds <= 0:
        return 0
    return max(_MIN_CONNECT_TIMEOUT, math.ceil(seconds))


class StatementDeadline(Exception):  # noqa: N818 - not an error of the caller's making
    """A statement got no answer within its deadline. The connection is closed: the server
    was asked to cancel the statement (if it still answers anything)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g}s")
        self.seconds = seconds


class DeadlineConnection(psycopg.Connection[Any]):
    """A connection whose every wait on the server (a statement, a commit) ends after
    ``statement_deadline`` seconds (None: waits as long as it takes).

    Client-side, so it holds for a server that is stopped, a silent TCP peer and a
    connection pooler alike (no startup ``options``, which PgBouncer refuses). When the
    deadline passes, ``deadline_passed`` is set and the statement is cancelled on the server
    (so a write that waited on a lock does not happen later): the statement then fails with
    ``QueryCanceled``. A server that does not confirm the cancel within 2 s is given up: the
    connection is closed and :class:`StatementDeadline` raised.
    """

    statement_deadline: float | None = None
    deadline_passed: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = self.statement_deadline
        if limit is None or timeout is not None:
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, limit)
        except psycopg.errors._WaitTimeout:
            self.deadline_passed = limit
        try:
            self.cancel_safe(timeout=_CANCEL_WAIT)
            # The statement ends now: cancelled, or it finished just in time.
            return super().wait(gen, interval, _CANCEL_WAIT)
        except psycopg.Error:
            pass
        self.close()
        raise StatementDeadline(limit)
