"""Rescue: rows whose lease expired, any supervisor's, every ``rescue_interval``.

Their worker is presumed dead: the attempt counts as failed and the row goes back at once
(or to dead, or to cancelled if a cancel was requested); from the second lease expiry in a
row of the same job, after the job's backoff (the rule is the statement's, queries.sql). Outcomes of this supervisor still
waiting to be written come first: rescued, they would be run again. The same tick runs the
workflow sweep (atlantis.workflow_sweep): workflows past their deadline, the one workflow
transition that only time finds; forgets the rate windows that ended
(atlantis.limit_sweep); and wakes the waits for an event or a join that no send or child's
end woke (atlantis.event_sweep, atlantis.join_sweep). From the first tick on, it also
releases at once the running rows of a supervisor of this host that is provably gone (its
lock file free, none of its processes left: :mod:`identity`), instead of waiting for their
leases to end.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from atlantis.store import liveness
from atlantis.store import supervision as sql
from atlantis.supervisor import identity, policy
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service

log = logging.getLogger("atlantis.supervisor")

#: After its start, how long a supervisor looks for the gone supervisors of its host every
#: GONE_RECHECK seconds (then at every rescue interval).
GONE_WINDOW = 15.0
GONE_RECHECK = 0.5


class Rescue(Service):
    name = "rescue"

    def __init__(self, rt: Runtime, flush: asyncio.Event) -> None:
        super().__init__(rt)
        self.db = rt.db("upkeep")  # shared with the worker row (presence)
        self.flush = flush
        """Set to have the completer write what it has now."""
        self.unproven = False
        """A silent supervisor of this host was not known to be gone at the last look."""

    def loops(self) -> list[Loop]:
        return [self._rescue_loop]

    async def _rescue_loop(self) -> None:
        started = time.monotonic()
        while True:
            await self.rescue()
            next_tick = time.monotonic() + self.rt.settings.rescue_interval
            # Just after a start, a supervisor of this host that died may still be ending its
            # attempts' processes (its lease keeper kills their trees): look again every half
            # second, so that its rows run again within seconds of this start, not a rescue
            # interval later.
            while (self.unproven and time.monotonic() - started < GONE_WINDOW
                   and time.monotonic() + GONE_RECHECK < next_tick):
                await asyncio.sleep(GONE_RECHECK)
                try:
                    await self.rescue_gone()
                except (DatabaseUnavailable, StatementRejected):
                    pass
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))

    async def rescue(self) -> None:
        rt = self.rt
        # Results of ours still waiting to be written (say, finished during an outage) would
        # be rescued as "lease expired" and run again: write them first.
        now = rt.now()
        if any(policy.lease_lost(now, a.lease_end, a.heartbeat) for a in rt.ledger.unwritten):
            self.flush.set()
            return
        try:
            rows = await sql.rescue(self.db, rt.worker_id, rt.settings.rescue_batch,
                                    rt.settings.max_backoff)
        except (DatabaseUnavailable, StatementRejected):
            return
        rt.metrics.rescued.inc(len(rows))
        rt.ledger.rescued(r.id for r in rows)
        try:  # workflows past their deadline: the one transition only time finds
            await sql.workflow_sweep(self.db, rt.settings.rescue_batch)
            await sql.limit_sweep(self.db, rt.settings.rescue_batch)  # rate windows ended
            await sql.event_sweep(self.db, rt.settings.rescue_batch)  # events a wait missed
            await sql.join_sweep(self.db, rt.settings.rescue_batch)  # joins no end woke
        except (DatabaseUnavailable, StatementRejected):
            pass
        for r in rows:
            log.warning("job=%s: lease expired, its worker presumed dead; now %s", r.id, r.state,
                        extra={"job_id": r.id, "queue": r.queue})
        if rows:
            rt.wake.set()
        try:
            await self.rescue_gone()
        except (DatabaseUnavailable, StatementRejected):
            pass

    async def rescue_gone(self) -> None:
        """The rows of the supervisors of this host that are provably gone, released now.
        ``unproven``: some silent supervisor of this host is not (yet) known to be gone."""
        rt = self.rt
        self.unproven = False
        folder = identity.runtime_dir(rt.settings.runtime_dir)
        boot = identity.boot_id()
        if folder is None or boot is None:
            return
        for worker in await liveness.gone_candidates(self.db, rt.worker_id,
                                                     socket.gethostname(), boot):
            proof = await asyncio.to_thread(identity.gone, folder, worker)
            if isinstance(proof, str):
                log.debug("worker %s is not known to be gone: %s", worker, proof)
                self.unproven = True
                continue
            try:
                rows = await liveness.rescue_gone(self.db, worker, rt.worker_id,
                                                  rt.settings.max_backoff)
            except BaseException:
                identity.forget(folder, worker, proof, unlink=False)  # the next tick, again
                raise
            identity.forget(folder, worker, proof)
            rt.metrics.rescued.inc(len(rows))
            for r in rows:
                log.warning("job=%s: worker %s is gone (its lock free, none of its processes "
                            "left on this host); now %s", r.id, worker, r.state,
                            extra={"job_id": r.id, "queue": r.queue})
            if rows:
                rt.wake.set()
