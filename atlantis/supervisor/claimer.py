"""The claimer: claims as many rows as there are idle children, and hands them out.

One statement claims for every idle child at once (a materialized CTE with SKIP LOCKED,
in a transaction so that a claim delivered late is rolled back). It wakes on NOTIFY, on a
child becoming idle, and polls as a fallback. Rows of a claim whose answer was lost (the
COMMIT went through, its reply did not) are given back at the next round.
"""

from __future__ import annotations

import asyncio
import logging

from atlantis.store.jobs import ClaimedRow, ReleasedRow
from atlantis.store.queries import Q
from atlantis.supervisor import policy
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.completer import Completer
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.pool import Pool
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service

log = logging.getLogger("atlantis.supervisor")


class Claimer(Service):
    name = "claimer"

    def __init__(self, rt: Runtime, pool: Pool, completer: Completer, jobs: list[str]) -> None:
        super().__init__(rt)
        self.db = rt.db("claim")
        self.pool = pool
        self.completer = completer
        self.jobs = jobs
        self._orphans_possible = False

    def loops(self) -> list[Loop]:
        return [self._claim_loop]

    async def _claim_loop(self) -> None:
        rt = self.rt
        failures = 0
        while not rt.draining:
            if failures:
                await asyncio.sleep(policy.backoff(0.1, failures, cap=2.0))
            try:
                await asyncio.wait_for(rt.wake.wait(), rt.settings.poll_interval)
            except TimeoutError:
                pass
            rt.wake.clear()
            if rt.draining:
                return
            try:
                if self._orphans_possible:
                    await self._release_orphans()
                    self._orphans_possible = False
                await self._claim()
            except DatabaseUnavailable as exc:
                self._orphans_possible = self._orphans_possible or exc.sent
                failures += 1
                continue
            except StatementRejected as exc:
                log.error("a claim was refused by the database: %s", exc)
                failures += 1
                continue
            failures = 0

    async def _claim(self) -> None:
        rt = self.rt
        idle = len(self.pool.idle())
        queues = [q for q in rt.settings.queues if q not in rt.paused]
        if not idle or not queues:
            return
        # In a transaction: a claim abandoned on a link that delivers it late is rolled back.
        # Only a COMMIT whose answer is lost leaves rows claimed for nobody; the next round
        # gives those back (_release_orphans).
        rows = await self.db.fetch_rows(ClaimedRow, Q.claim, {
            "queues": queues, "jobs": self.jobs, "limit": idle,
            "worker": rt.worker_id,
        }, timeout=rt.settings.claim_timeout, transaction=True)
        t0 = self.db.sent_at  # not before the wait for a connection: see Db.sent_at
        for row in rows:
            self._dispatch(row, t0)
        if rows and len(rows) == idle:
            rt.wake.set()  # more work may be waiting

    def _dispatch(self, row: ClaimedRow, t0: float) -> None:
        a = Attempt(row=row, lease_end=t0 + row.heartbeat, renewed_at=t0)
        self.rt.in_flight[row.id] = a
        if not self.pool.assign(a):  # a child died while we claimed: give the row back now
            self.completer.record(a, policy.RELEASE)

    async def _release_orphans(self) -> None:
        """Give back rows claimed by a claim whose answer never arrived (see the query)."""
        rt = self.rt
        # Lost attempts did run: their rows are left to be rescued as failures, not released.
        known = [*rt.in_flight, *(a.job_id for a in self.completer.pending), *rt.lost_ids]
        rows = await self.db.fetch_rows(ReleasedRow, Q.release_orphans,
                                        {"worker": rt.worker_id, "known": known}, timeout=5)
        if rows:
            log.warning("released %d rows claimed by a claim whose answer was lost: %s",
                        len(rows), ", ".join(str(r.id) for r in rows))
            rt.wake.set()
