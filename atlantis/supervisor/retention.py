"""Retention: finished jobs are deleted some time after they finished.

Every ``retention_interval`` (and once at start) the supervisor deletes ``complete`` and
``cancelled`` jobs that finished more than ``--retention`` ago (default 7d) and ``dead`` ones
older than ``--dead-retention`` (default 30d), each with its attempts and logs; ``0``
disables either. Waiting and running jobs are never deleted. The deleting is done by
``atlantis.prune`` (store/live/operators.sql, shared with ``tide job prune``), a batch of at most
``--retention-batch`` jobs per transaction, each under a transaction-level advisory lock: while one
supervisor prunes, the others skip their turn instead of competing for the same rows.

Slots of ``atlantis.schedule_runs`` recorded longer ago than the longer of the two
retentions go too (each schedule's latest stays); not while either retention is disabled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from atlantis.store import upkeep as sql
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service

log = logging.getLogger("atlantis.supervisor")

LOCK_KEY = 0x61746C5F70727565  # "atl_prue": atlantis retention
"""The advisory lock one pruning supervisor holds, per batch."""
MIN_INTERVAL = 1.0
"""The shortest pause between two rounds, whatever ``retention_interval`` says."""


class Retention(Service):
    name = "retention"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.db = rt.db("retention")

    def loops(self) -> list[Loop]:
        s = self.rt.settings
        return [self._retention_loop] if s.retention > 0 or s.dead_retention > 0 else []

    async def _retention_loop(self) -> None:
        while True:
            await self.prune()
            await asyncio.sleep(max(self.rt.settings.retention_interval, MIN_INTERVAL))

    async def prune(self) -> int | None:
        """One round; how many jobs it deleted, or None if another supervisor was pruning or
        the database could not be reached."""
        s = self.rt.settings
        total = 0
        for states, older_than in ((["complete", "cancelled"], s.retention),
                                   (["dead"], s.dead_retention)):
            if older_than <= 0:
                continue
            done = await self._batches(
                partial(sql.prune_jobs, self.db, states, older_than, LOCK_KEY, s.retention_batch))
            if done is None:
                return None
            if done:
                log.info("retention: deleted %d %s jobs finished more than %s ago", done,
                         "/".join(states), _age(older_than))
            total += done
        if s.retention > 0 and s.dead_retention > 0:
            longest = max(s.retention, s.dead_retention)
            if await self._batches(
                    partial(sql.prune_schedule_runs, self.db, longest, LOCK_KEY,
                            s.retention_batch)) is None:
                return None
        return total

    async def _batches(self, batch: Callable[[], Awaitable[int]]) -> int | None:
        """Run ``batch`` after batch while batches come back full; the rows deleted, or
        None if another supervisor holds the lock or the database is away."""
        deleted = 0
        while True:
            try:
                count = await batch()
            except (DatabaseUnavailable, StatementRejected) as exc:
                log.warning("retention: pruning stopped for this round: %s", exc)
                return None
            if count < 0:
                return None  # another supervisor is at it
            deleted += count
            if count < self.rt.settings.retention_batch:
                return deleted
            await asyncio.sleep(0)  # let the loop breathe between batches


def _age(seconds: float) -> str:
    from atlantis.units import format_duration

    return format_duration(seconds)
