"""Upkeep: rescue of expired leases, the worker row, LISTEN, and what systemd is told.

Each runs on a connection of its own, so none of them ever delays a lease renewal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

import orjson
from psycopg.types.json import Jsonb

from atlantis.store.jobs import RescuedRow
from atlantis.store.queries import Q
from atlantis.supervisor import policy
from atlantis.supervisor.completer import Completer
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.leases import cancel
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")


class Upkeep(Service):
    name = "upkeep"

    def __init__(self, rt: Runtime, completer: Completer, children: Callable[[], int],
                 served: Callable[[], list[str]]) -> None:
        super().__init__(rt)
        self.db = rt.db("upkeep")
        self.db_listen = rt.db("listen")
        self.db_poll = rt.db("poll")
        self._pause_now = asyncio.Event()
        self.completer = completer
        self.children = children
        self.served = served
        self.refresh = asyncio.Event()
        """Set when the jobs served changed (a reload): the worker row says so at once."""

    def loops(self) -> list[Loop]:
        return [self._rescue_loop, self._worker_loop, self._listen_loop, self._status_loop,
                self._cancel_loop, self._pause_loop]

    # ---- rescue ---------------------------------------------------------------------------

    async def _rescue_loop(self) -> None:
        while True:
            await self.rescue()
            await asyncio.sleep(self.rt.settings.rescue_interval)

    async def rescue(self) -> None:
        rt = self.rt
        # Results of ours still waiting to be written (say, finished during an outage) would
        # be rescued as "lease expired" and run again: write them first.
        now = rt.now()
        if any(policy.lease_lost(now, a.lease_end, a.heartbeat) for a in self.completer.pending):
            self.completer.flush.set()
            return
        try:
            rows = await self.db.fetch_rows(RescuedRow, Q.rescue,
                                            {"limit": 1000, "worker": rt.worker_id}, timeout=10)
        except (DatabaseUnavailable, StatementRejected):
            return
        rt.metrics.rescued.inc(len(rows))
        for r in rows:
            log.warning("job=%s: lease expired, its worker presumed dead; now %s", r.id, r.state,
                        extra={"job_id": r.id, "queue": r.queue})
        if rows:
            rt.wake.set()

    # ---- the worker row -------------------------------------------------------------------

    async def _worker_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.refresh.wait(), self.rt.settings.worker_refresh)
            except TimeoutError:
                pass
            self.refresh.clear()
            await self.register()

    #: Children whose memory a refresh of the worker row reads at most; beyond, those read
    #: least often, the others as last read (with 500 attempts in flight each is read
    #: every 5 refreshes: reading every tree each time cost ~1.5% of a core).
    RSS_PER_REFRESH = 100

    async def register(self) -> None:
        rt = self.rt
        attempts = list(rt.in_flight.values())
        children = [a.child for a in attempts if a.child is not None]
        if len(children) > self.RSS_PER_REFRESH:
            children.sort(key=lambda c: c.rss_read)
            children = children[:self.RSS_PER_REFRESH]
        for child in children:
            child.rss()
        jobs = [{"job_id": a.job_id, "attempt": a.attempt,
                 "child_pid": a.child.pid if a.child else None,
                 "rss": a.child.last_rss if a.child else 0} for a in attempts]
        try:
            await self.db.fetch(Q.worker_upsert, {
                "id": rt.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": list(rt.settings.queues), "concurrency": rt.settings.concurrency,
                "in_flight": len(rt.in_flight),
                "status": "draining" if rt.draining else "running", "ttl": rt.settings.worker_ttl,
                "jobs": Jsonb(jobs), "job_types": self.served(),
            }, timeout=5)
            rows = await self.db.fetch(Q.queue_gauges, {"queues": list(rt.settings.queues)},
                                       timeout=5)
        except (DatabaseUnavailable, StatementRejected):
            return
        rt.metrics.stalled.set(rows[0][0])
        rt.metrics.dead.set(rows[0][1])

    async def unregister(self) -> None:
        try:
            # During an outage, do not hold the stop up for it: the row expires by itself.
            await self.db.fetch(Q.worker_delete, {"id": self.rt.worker_id},
                                timeout=1 if self.rt.health.down_since is not None else 5)
        except (DatabaseUnavailable, StatementRejected):
            pass

    # ---- notifications --------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        """Wake the claimer on NOTIFY; its poll covers any gap.

        NOTIFYs sent while no session listens are lost, so every new session wakes the
        claimer once. LISTEN is re-issued every ``listen_ping``: a no-op for the server and
        a round trip that proves a quiet connection alive (a half-open one would otherwise
        swallow notifications forever without an error).
        """
        rt = self.rt
        queues = set(rt.settings.queues)
        db = self.db_listen
        session = db.connects
        while not rt.draining:
            try:
                await db.fetch(Q.listen, timeout=5)
            except (DatabaseUnavailable, StatementRejected):
                await asyncio.sleep(0.1)  # the connection's backoff paces the retries
                continue
            if db.connects != session:
                session = db.connects
                rt.wake.set()  # anything enqueued while we were not listening
            try:
                async for channel, payload in db.notifications(rt.settings.listen_ping):
                    if channel == "atlantis_control":
                        self._control(payload)
                    elif payload in queues:
                        rt.wake.set()
            except DatabaseUnavailable:
                continue

    def _control(self, payload: str) -> None:
        """An operator's request: a cancel (for our attempts), a pause or a resume."""
        try:
            msg = orjson.loads(payload)
            op = msg["op"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            log.warning("ignored a malformed control notification: %.200s", payload)
            return
        rt = self.rt
        if op == "cancel" and msg.get("worker") == rt.worker_id:
            a = rt.in_flight.get(msg.get("job_id"))
            if a is not None:
                cancel(rt, a)
        elif op in ("pause", "resume") and msg.get("queue") in rt.settings.queues:
            self._pause_now.set()

    # ---- cancels and pauses: the polling fallback -----------------------------------------

    async def _cancel_loop(self) -> None:
        """Cancels this supervisor did not hear of (a lost NOTIFY), every ``cancel_poll``.

        Each lease renewal also reads its row's cancel request: attempts renewed at least
        as often as this poll (``heartbeat/3 <= cancel_poll``) hear of a cancel that way,
        so the poll runs only while another attempt is in flight.
        """
        rt = self.rt
        while True:
            await asyncio.sleep(rt.settings.cancel_poll)
            every = rt.settings.cancel_poll
            if not any(not a.cancelling and a.heartbeat / 3 > every
                       for a in rt.in_flight.values()):
                continue
            try:
                rows = await self.db_poll.fetch(Q.cancel_requests, {"worker": rt.worker_id},
                                                timeout=5)
            except (DatabaseUnavailable, StatementRejected):
                continue
            for (job_id,) in rows:
                a = rt.in_flight.get(job_id)
                if a is not None:
                    cancel(rt, a)

    async def _pause_loop(self) -> None:
        rt = self.rt
        while True:
            try:
                rows = await self.db_poll.fetch(Q.paused_queues,
                                                {"queues": list(rt.settings.queues)}, timeout=5)
            except (DatabaseUnavailable, StatementRejected):
                rows = None
            if rows is not None:
                paused = {r[0] for r in rows}
                if paused != rt.paused:
                    for q in sorted(paused - rt.paused):
                        log.warning("queue %s is paused: claiming nothing from it", q)
                    for q in sorted(rt.paused - paused):
                        log.warning("queue %s is resumed", q)
                    rt.paused = paused
                    rt.metrics.paused.set(len(paused))
                    rt.wake.set()
            self._pause_now.clear()
            try:
                await asyncio.wait_for(self._pause_now.wait(), rt.settings.pause_poll)
            except TimeoutError:
                pass

    # ---- systemd and metrics --------------------------------------------------------------

    def status(self) -> str:
        rt = self.rt
        db = ""
        if rt.health.down_since is not None:
            down = format_duration(round(rt.now() - rt.health.down_since))
            db = f", database unreachable for {down} ({rt.health.error})"
        phase = "draining" if rt.draining else "serving"
        return (f"STATUS={phase} {','.join(rt.settings.queues)}: "
                f"{len(rt.in_flight)}/{rt.settings.concurrency} in flight{db}")

    async def _status_loop(self) -> None:
        """STATUS follows the in-flight count (at most once a tick); WATCHDOG from here."""
        rt = self.rt
        last_status = last_watchdog = rt.now()
        last_in_flight = -1
        while True:
            now = rt.now()
            if now - last_status >= rt.settings.worker_refresh or len(rt.in_flight) != last_in_flight:
                last_status = now
                last_in_flight = len(rt.in_flight)
                rt.notifier.notify(self.status())
                rt.metrics.in_flight.set(last_in_flight)
                rt.metrics.children.set(self.children())
                rt.metrics.database_up.set(0 if rt.health.down_since is not None else 1)
            wd = rt.notifier.watchdog_interval
            if wd is not None and now - last_watchdog >= wd:
                last_watchdog = now
                rt.notifier.notify("WATCHDOG=1")
            await asyncio.sleep(rt.settings.tick)
