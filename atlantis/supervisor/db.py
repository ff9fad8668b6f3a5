"""The supervisor's connections: reconnect with backoff, bounded waits, outages reported.

Each role (claims, results, leases, upkeep, LISTEN) has its own connection so that a slow
statement of one never delays another; on one asyncio loop each connection runs one
statement at a time.

Every call has a deadline that covers everything it waits for: its turn on the
connection, reconnecting, and the statement itself. A caller that must act by a certain
time (the lease renewal, which must either succeed or kill the attempt before the lease
ends) can rely on getting an answer, or :class:`DatabaseUnavailable`, by then. A
half-open connection (the peer gone without a reset, or a link that holds every byte)
therefore never blocks a loop for longer than its deadline: an unanswered connection is
abandoned, not waited for.

Reconnection backs off exponentially with jitter per connection, and the backoff outlives
a single call, so a loop that retries every tick does not hammer a server that is down
(nor spin the CPU): a call whose next permitted attempt lies past its deadline waits out
the deadline and fails.

Errors are classified (:func:`classify`): a statement the server refused because of the
data it carries (SQLSTATE classes 22, 23, 54) raises :class:`StatementRejected`, so that
the caller can find the offending row and fail only that one; everything else (a broken
connection, 57P, 25xxx such as a read-only standby, XX, and whatever else the server may
say) is :class:`DatabaseUnavailable`: an outage to ride out with backoff. The supervisor
never exits because of a database error.

A connection that goes through a pooler in transaction mode prepares no statement
(:mod:`atlantis.supervisor.pooler`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import dict_row

from atlantis.store.database import describe_db_error
from atlantis.store.typed_rows import fields_row
from atlantis.supervisor import policy, pooler
from atlantis.supervisor.settings import Settings
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")

@dataclass(frozen=True)
class Timing:
    """How a connection waits and retries (``--connect-timeout``, ``--reconnect-first``,
    ``--reconnect-max``, ``--outage-report-every``: see :class:`Settings`)."""

    connect_timeout: float
    """The longest a single connection attempt may take (a half-open link never answers)."""
    reconnect_first: float
    reconnect_max: float
    """Reconnection backoff: the first retry comes fast (a restart takes a fraction of a
    second, and leases are renewed every heartbeat/3), the slowest once a second per
    connection, so a supervisor notices a returning server within about a second."""
    outage_report_every: float
    """While the database stays unreachable, say so again this often."""

    @classmethod
    def of(cls, settings: Settings) -> Timing:
        return cls(settings.connect_timeout, settings.reconnect_first, settings.reconnect_max,
                   settings.outage_report_every)


T = TypeVar("T")

DATA_ERROR_CLASSES = ("22", "23", "54")
"""SQLSTATE classes of errors caused by a statement's data: data exception, integrity
constraint violation, program limit exceeded (a row or value too large)."""


class StatementRejected(Exception):  # noqa: N818 - reads better at the except sites
    """The server refused the statement because of the data it carries; nothing was written.

    Retrying the same statement cannot help; retrying its rows one by one finds the bad one.
    """

    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def classify(exc: BaseException) -> str:
    """``rejected`` for errors caused by the statement's data, else ``outage``.

    Data the driver refuses before sending anything (a NUL in a text parameter, a value it
    cannot adapt) is rejected too.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate[:2] in DATA_ERROR_CLASSES:
        return "rejected"
    if isinstance(exc, psycopg.DataError | psycopg.IntegrityError):
        return "rejected"
    if not isinstance(exc, psycopg.Error) and isinstance(exc, ValueError | TypeError | OverflowError):
        return "rejected"
    return "outage"


class DatabaseUnavailable(Exception):  # noqa: N818 - reads better at the except sites
    """The statement did not complete: the database is unreachable, the connection broke,
    no answer came in time, or the server refused it for a transient reason.

    ``sent`` tells whether the statement may have reached the server: a write whose
    answer was lost may have committed all the same.
    """

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


class Health:
    """Whether the database answers, as seen by every connection of one supervisor.

    One outage is one story in the log ("unreachable", perhaps "still unreachable",
    "reachable again after ..."), however many connections notice it; ``on_change`` lets
    the supervisor update its systemd STATUS at once.
    """

    def __init__(self, report_every: float, on_change: Callable[[], None] | None = None
                 ) -> None:
        self.on_change = on_change
        self.report_every = report_every
        self.down_since: float | None = None
        self.error = ""
        self._said_at = 0.0

    def failed(self, role: str, error: str) -> None:
        now = asyncio.get_running_loop().time()
        self.error = error
        if self.down_since is None:
            self.down_since = self._said_at = now
            log.error("database unreachable (%s connection: %s); reconnecting with backoff, "
                      "attempts whose leases are still valid keep running", role, error)
            if self.on_change is not None:
                self.on_change()
        elif now - self._said_at >= self.report_every:
            self._said_at = now
            log.error("database still unreachable after %s: %s",
                      format_duration(round(now - self.down_since)), error)

    def answered(self) -> None:
        if self.down_since is None:
            return
        lasted = asyncio.get_running_loop().time() - self.down_since
        self.down_since = None
        self.error = ""
        log.warning("database reachable again after %.1fs", lasted)
        if self.on_change is not None:
            self.on_change()


class Db:
    """One role's connection; see the module docstring for the waiting rules."""

    def __init__(self, url: str, role: str, timing: Timing, health: Health | None = None, *,
                 pooled: bool = False) -> None:
        self.url = url
        self.role = role
        self.declared_pooled = pooled
        """``--pooled``: never prepare, and do not ask."""
        self.pooled: bool | None = True if pooled else None
        """Whether the latest connection goes through a pooler (None: none made yet)."""
        self.timing = timing
        self.health = health if health is not None else Health(timing.outage_report_every)
        self.connects = 0
        """How many connections this role has opened: a change means a new session."""
        self.sent_at = 0.0
        """Loop time just before the latest statement went out. A lease it granted (server
        ``now()`` + heartbeat) cannot end before ``sent_at`` + heartbeat, however long the
        call waited for its turn or a connection beforehand."""
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = "not connected yet"
        self._abandoned: set[asyncio.Task[None]] = set()

    async def fetch(
        self, query: LiteralString, params: dict[str, Any] | None = None, *, timeout: float = 30.0,
        transaction: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run one statement; its rows, if it returns any, within ``timeout`` seconds.

        Raises :class:`DatabaseUnavailable` if it did not complete in time (see there).

        ``transaction``: wrap it in BEGIN ... COMMIT, the COMMIT sent only once the rows are
        here. For a claim: on a link that holds bytes and delivers them late, an abandoned
        autocommit claim would still run and take rows for a caller that gave up on them
        (they would sit until their lease ended, and lose an attempt); in a transaction it
        is rolled back when its connection goes away without a COMMIT.
        """
        rows: list[tuple[Any, ...]] = await self._call(query, params, timeout, dicts=False,
                                                       transaction=transaction)
        return rows

    async def fetch_rows(
        self, row: type[T], query: LiteralString, params: dict[str, Any] | None = None, *,
        timeout: float = 30.0, transaction: bool = False,
    ) -> list[T]:
        """As :meth:`fetch`, with rows read into ``row`` (a dataclass) by column name."""
        rows: list[T] = await self._call(query, params, timeout, dicts=row,
                                         transaction=transaction)
        return rows

    async def notifications(self, period: float) -> AsyncIterator[tuple[str, str]]:
        """(channel, payload) of the NOTIFYs that reach this connection during ``period`` s.

        The caller LISTENs first with :meth:`fetch`, and calls again after each period;
        that statement in between doubles as proof that a quiet connection still lives.
        """
        async with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                raise DatabaseUnavailable(f"{self.role}: not connected")
            try:
                async for note in conn.notifies(timeout=period):
                    yield note.channel, note.payload
            except psycopg.OperationalError as exc:
                await self._lost(conn, exc)
                raise DatabaseUnavailable(describe_db_error(exc, self.url)) from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._close_quietly(conn)
        if self._abandoned:  # give abandoned statements a moment to be cancelled cleanly
            await asyncio.wait(set(self._abandoned), timeout=1.0)

    # ---- internals ------------------------------------------------------------------------

    async def _call(self, query: LiteralString, params: dict[str, Any] | None, timeout: float,
                    *, dicts: type[Any] | bool, transaction: bool = False) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            # The statement ahead of us is itself bounded and reports the outage if any.
            raise DatabaseUnavailable(f"{self.role}: the connection stayed busy for "
                                      f"{format_duration(timeout)}") from None
        try:
            conn = await self._connection(deadline)
            return await self._run(conn, query, params, deadline, dicts=dicts, transaction=transaction)
        finally:
            self._lock.release()

    async def _connection(self, deadline: float) -> psycopg.AsyncConnection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self._retry_at >= deadline:
                # Not allowed to try again in time: wait out the deadline rather than fail at
                # once, so that callers retrying in a loop are paced by the backoff.
                await asyncio.sleep(deadline - now)
                raise DatabaseUnavailable(self._last_error)
            if self._retry_at > now:
                await asyncio.sleep(self._retry_at - now)
            budget = min(self.timing.connect_timeout, deadline - loop.time())
            try:
                async with asyncio.timeout(budget):
                    conn, pooled = await pooler.connect(self.url, self.role, budget,
                                                        pooled=self.declared_pooled)
            except (psycopg.Error, TimeoutError) as exc:
                self._last_error = describe_db_error(exc, self.url) if str(exc).strip() else "connection attempt timed out"
                self._failures += 1
                self._retry_at = loop.time() + self._backoff()
                self.health.failed(self.role, self._last_error)
                if loop.time() >= deadline:
                    raise DatabaseUnavailable(self._last_error) from exc
                continue
            if self._failures:
                log.info("database connection %s re-established after %d failed attempts",
                         self.role, self._failures)
            self.pooled = pooled
            self._failures = 0
            self._retry_at = 0.0
            self._conn = conn
            self.connects += 1
            self.health.answered()
            return conn

    def _backoff(self) -> float:
        """The supervisor's backoff (policy.backoff_wait) with full jitter, for the failures
        so far: a fleet's reconnects after an outage do not arrive together."""
        return policy.backoff(self.timing.reconnect_first, self._failures,
                              cap=self.timing.reconnect_max, full_jitter=True)

    async def _run(self, conn: psycopg.AsyncConnection[Any], query: LiteralString,
                   params: dict[str, Any] | None, deadline: float, *, dicts: type[Any] | bool,
                   transaction: bool) -> Any:
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:  # the wait for our turn used it all: do not start
            raise DatabaseUnavailable(f"{self.role}: no time left to run the statement")
        self.sent_at = loop.time()
        task = asyncio.ensure_future(self._execute(conn, query, params, dicts=dicts,
                                                   transaction=transaction))
        try:
            done, _ = await asyncio.wait({task}, timeout=max(deadline - loop.time(), 0.0))
        except asyncio.CancelledError:
            self._abandon(conn, task)
            raise
        if not done:
            self._abandon(conn, task)
            error = "no answer in time (connection abandoned)"
            log.info("database connection %s abandoned: no answer in time", self.role)
            self.health.failed(self.role, error)
            raise DatabaseUnavailable(error, sent=True)
        try:
            result = task.result()
        except Exception as exc:
            rejected = classify(exc) == "rejected"
            if conn.closed or getattr(conn, "broken", False) or (
                    not rejected and not isinstance(exc, psycopg.Error)):
                await self._lost(conn, exc)
                raise DatabaseUnavailable(describe_db_error(exc, self.url), sent=True) from exc
            self.health.answered()
            if rejected:
                raise StatementRejected(describe_db_error(exc, self.url), getattr(exc, "sqlstate", None)) from exc
            assert isinstance(exc, psycopg.Error)
            # The server answered but refused for another reason (deadlock, lock or
            # statement timeout, too many connections, a read-only standby, an internal
            # error...): the statement did not run; callers retry with backoff.
            log.warning("database %s: %s (SQLSTATE %s)", self.role, describe_db_error(exc, self.url), exc.sqlstate)
            raise DatabaseUnavailable(describe_db_error(exc, self.url)) from exc
        self.health.answered()
        return result

    @staticmethod
    async def _execute(conn: psycopg.AsyncConnection[Any], query: LiteralString,
                       params: dict[str, Any] | None, *, dicts: type[Any] | bool,
                       transaction: bool) -> Any:
        if isinstance(dicts, type):
            cur: Any = conn.cursor(row_factory=fields_row(dicts))
        else:
            cur = conn.cursor(row_factory=dict_row) if dicts else conn.cursor()
        if not transaction:
            await cur.execute(query, params)
            return await cur.fetchall() if cur.description else []
        async with conn.transaction():
            await cur.execute(query, params)
            return await cur.fetchall() if cur.description else []

    async def _lost(self, conn: psycopg.AsyncConnection[Any], exc: BaseException) -> None:
        """The connection broke under us: forget it; the next call reconnects.

        Not yet an outage: an idle connection often learns only now that the server
        restarted a while ago. The database is reported unreachable if reconnecting fails.
        """
        if self._conn is conn:
            self._conn = None
        self._last_error = describe_db_error(exc, self.url)
        log.info("database connection %s lost: %s", self.role, self._last_error)
        await self._close_quietly(conn)

    def _abandon(self, conn: psycopg.AsyncConnection[Any], task: asyncio.Future[Any]) -> None:
        """Stop waiting for a statement: the next call gets a new connection at once.

        Cancelling the statement makes psycopg ask the server to cancel it (which releases
        its locks if the server is still there) and close the socket; that can take it some
        seconds on a dead link, so it happens in the background, and the socket is closed
        only after that task, the one thing still waiting on it, has let go of it.
        """
        if self._conn is conn:
            self._conn = None

        async def bury() -> None:
            task.cancel()
            await asyncio.wait({task})  # psycopg bounds its own cancellation (about 10 s)
            if not task.cancelled() and task.exception() is None:
                log.warning("database %s: an abandoned statement completed after all; a claim "
                            "among them leaves rows to be rescued when their lease ends", self.role)
            await self._close_quietly(conn)

        buried = asyncio.ensure_future(bury())
        self._abandoned.add(buried)
        buried.add_done_callback(self._abandoned.discard)

    @staticmethod
    async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            await asyncio.wait_for(conn.close(), 1.0)
        except (TimeoutError, psycopg.Error, OSError):
            pass
