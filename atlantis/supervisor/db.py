"""The supervisor's connections: reconnect with backoff, bounded waits, outages reported.

Each role (claims, results, leases, LISTEN) has its own connection so that a slow
statement of one never delays another; on one asyncio loop each connection runs one
statement at a time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, LiteralString

import psycopg
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

log = logging.getLogger("atlantis.supervisor")


class DatabaseUnavailable(Exception):  # noqa: N818 - reads better at the except sites
    """The statement did not run: the database is unreachable or the connection broke."""


class Db:
    def __init__(self, url: str, role: str, *, connect_budget: float = 5.0) -> None:
        self.url = url
        self.role = role
        self.connect_budget = connect_budget
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.down_since: float | None = None

    @property
    def healthy(self) -> bool:
        return self._conn is not None and not self._conn.closed and self.down_since is None

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(self.connect_budget),
                wait=wait_exponential_jitter(initial=0.05, max=2.0),
                retry=retry_if_exception_type(psycopg.OperationalError),
                reraise=True,
            ):
                with attempt:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self.url, autocommit=True, connect_timeout=5,
                        application_name=f"atlantis-supervise:{self.role}",
                        keepalives=1, keepalives_idle=5, keepalives_interval=2,
                        keepalives_count=3,
                    )
        except psycopg.OperationalError as exc:
            self._mark_down(exc)
            raise DatabaseUnavailable(str(exc).strip()) from exc
        if self.down_since is not None:
            log.warning("database connection %s restored", self.role)
            self.down_since = None
        assert self._conn is not None
        return self._conn

    def _mark_down(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = asyncio.get_running_loop().time()
            log.error("database connection %s lost: %s", self.role, str(exc).strip() or type(exc).__name__)

    async def reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), 1.0)
            except (TimeoutError, psycopg.Error, OSError):
                pass

    async def fetch(
        self, query: LiteralString, params: dict[str, Any] | None = None, *, timeout: float = 30.0
    ) -> list[tuple[Any, ...]]:
        """Run one statement; rows if it returns any. DatabaseUnavailable if it did not run."""
        conn = await self.connection()
        try:
            async with asyncio.timeout(timeout):
                cur = await conn.execute(query, params)
                return await cur.fetchall() if cur.description else []
        except (psycopg.OperationalError, TimeoutError) as exc:
            self._mark_down(exc)
            await self.reset()
            raise DatabaseUnavailable(str(exc).strip() or "statement timed out") from exc

    async def close(self) -> None:
        await self.reset()
