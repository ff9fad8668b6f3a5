"""Leases: every lease in flight renewed, lost leases acted on, checkpoints written.

One statement renews every lease that is due (every heartbeat/3) and carries the
checkpoints that came in meanwhile (coalesced per attempt: a checkpoint is written with the
next renewal, or within ``progress_interval`` when no renewal comes sooner). A renewal that
does not come back in time, or comes back without a row, means the lease is lost: the
attempt is killed at once and nothing more of it is written. A renewal also reads each
row's cancel request. The limits of an attempt (timeouts, graces, memory, tasks) are
:mod:`enforcement`'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
from operator import attrgetter

from atlantis.store import supervision as sql
from atlantis.store.supervision import Renewal
from atlantis.supervisor import policy
from atlantis.supervisor.attempts import Attempt, Soonest
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.ledger import IDLE_TICK
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service

log = logging.getLogger("atlantis.supervisor")
NEXT_RENEWAL = attrgetter("next_renewal")


class Leases(Service):
    name = "leases"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.db = rt.db("lease")
        self.ledger = rt.ledger
        self._renewing: asyncio.Task[None] | None = None

    def loops(self) -> list[Loop]:
        return [self._renew_loop]

    async def _renew_loop(self) -> None:
        rt = self.rt
        soonest = Soonest()
        while True:
            now = rt.now()
            due = False
            for a in soonest.walk(now, self.ledger.in_flight.values(), NEXT_RENEWAL):
                due = self.check(a, now) or due
            if due and (self._renewing is None or self._renewing.done()):
                batch = self._due(now)
                if batch:
                    self._renewing = asyncio.create_task(self._renew(batch), name="leases.renew")
            await self.ledger.tick(rt.settings.tick, IDLE_TICK)

    def check(self, a: Attempt, now: float) -> bool:
        """True if ``a``'s lease or checkpoint should be written now; a lease past saving is
        lost. Sets ``a.next_renewal``: with hundreds of long attempts, most ticks look at
        none."""
        if not a.lost and policy.lease_lost(now, a.lease_end, a.heartbeat):
            self.ledger.lose(a, "the lease could not be renewed in time; killing the attempt "
                                "so that no other worker runs the row alongside it")
        if a.lost:
            a.next_renewal = math.inf
            return False
        lose_at = a.lease_end - policy.lease_margin(a.heartbeat)
        if self._renewing is not None and not self._renewing.done():
            # A renewal is on its way: until it is answered (and :meth:`_renew` asks for a
            # look at every attempt again), only the loss of this lease can come due.
            a.next_renewal = lose_at
            return False
        interval = self.rt.settings.progress_interval
        renew_at = a.renewed_at + a.heartbeat / 3
        flush_at = a.checkpoint_since + interval if a.checkpoint_dirty else math.inf
        a.next_renewal = min(lose_at, renew_at, flush_at)
        return not a.finished and now >= min(renew_at, flush_at)

    def _due(self, now: float) -> list[Attempt]:
        live = [a for a in self.ledger.in_flight.values() if not a.lost and not a.finished]
        if any(policy.renewal_due(now, a.renewed_at, a.heartbeat) for a in live):
            return live
        return [a for a in live if a.checkpoint_dirty
                and now - a.checkpoint_since >= self.rt.settings.progress_interval]

    async def _renew(self, batch: list[Attempt]) -> None:
        try:
            await self._renew_batch(batch)
        finally:
            for a in list(self.ledger.in_flight.values()):  # each looked at afresh
                a.look_again(lease=True)

    async def _renew_batch(self, batch: list[Attempt]) -> None:
        rt = self.rt
        t0 = rt.now()
        # The renewal must be answered before the first of these attempts is killed for want
        # of it: a renewal that lands after the kill would only hold the dead row back.
        budget = min(a.lease_end - policy.lease_margin(a.heartbeat) for a in batch) - t0
        if budget <= 0:
            return
        renewals = [Renewal(a.job_id, a.attempt, a.checkpoint if a.checkpoint_dirty else None,
                            a.run, a.row.run_id) for a in batch]
        for a in batch:
            a.checkpoint_sent = a.checkpoint_sent or a.checkpoint_dirty
            a.checkpoint_dirty = False
        try:
            try:
                renewed = await sql.renew(self.db, rt.worker_id, renewals, budget)
            except StatementRejected as exc:
                # A checkpoint the database refuses must not cost the leases: renew without.
                log.error("checkpoints refused by the database (%s); renewing the leases "
                          "without them", exc)
                renewals = [Renewal(r.job_id, r.attempt, None, r.run, r.run_id)
                            for r in renewals]
                budget = min(a.lease_end - policy.lease_margin(a.heartbeat) for a in batch) - rt.now()
                renewed = await sql.renew(self.db, rt.worker_id, renewals,
                                          max(budget, 0.001))
        except (DatabaseUnavailable, StatementRejected):
            for a, r in zip(batch, renewals, strict=True):
                a.checkpoint_sent = False
                if r.progress is not None and not a.checkpoint_dirty:
                    a.checkpoint_dirty = True
                    a.checkpoint_since = t0
                    a.look_again(lease=True)
            return
        rt.metrics.renewals.inc()
        rt.metrics.leases_renewed.inc(len(renewed))
        sent = self.db.sent_at  # the renewal counts from when it went out, not from before
        for a in batch:
            a.checkpoint_sent = False  # answered: written where the row was still running
            if a.lost or a.finished:
                continue  # ended while the renewal was on its way
            if a.job_id in renewed:
                a.leased(sent)
                if renewed[a.job_id]:
                    self.ledger.cancel(a.job_id)
            else:
                self.ledger.lose(a, "the lease is gone (the row was rescued or changed); "
                                    "killing the attempt, nothing of it will be written")
