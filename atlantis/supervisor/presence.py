"""Presence: how the supervisor shows itself: its worker row, gauges, systemd and metrics.

Started first and stopped last: the worker row exists before the first claim and is deleted
after the last outcome is written. The row is refreshed every ``worker_refresh`` (and at
once when the jobs served change), and marked alive every ``liveness_interval`` whatever
the jobs' heartbeats (a row not marked for two intervals is silent); the lock file that
proves this supervisor gone once it is (:mod:`identity`) is held from before the row is
written until after it is deleted. STATUS follows the attempts in flight; WATCHDOG is sent
from here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

from atlantis.store import liveness
from atlantis.store import upkeep as sql
from atlantis.store.upkeep import WorkerReport
from atlantis.supervisor import identity
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.supervisor.waiting import until_set
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")


class Presence(Service):
    name = "presence"

    def __init__(self, rt: Runtime, children: Callable[[], int],
                 served: Callable[[], list[str]]) -> None:
        super().__init__(rt)
        self.db = rt.db("upkeep")  # shared with rescue
        self.children = children
        self.served = served
        self.refresh = asyncio.Event()
        """Set when the jobs served or the order changed: the worker row says so at once."""
        self.folder = identity.runtime_dir(rt.settings.runtime_dir)
        self.lock = -1
        """This supervisor's lock file's descriptor, held while it runs (-1: none)."""
        self.order_status: Callable[[], str | None] = lambda: None
        """``draining`` or ``drained`` under an operator's order (orders.py), else None."""

    def loops(self) -> list[Loop]:
        return [self._worker_loop, self._liveness_loop, self._status_loop]

    async def start(self) -> None:
        """Metrics served, the worker row written; then the loops."""
        rt = self.rt
        s = rt.settings
        if s.metrics_port:
            rt.metrics.serve(s.metrics_port, s.metrics_host)
            log.info("metrics on http://%s:%d/metrics", s.metrics_host, s.metrics_port)
        self.lock = identity.hold(self.folder, rt.worker_id)
        await self.register()
        await super().start()

    async def stop(self) -> None:
        await self.cancel_loops()
        await self.unregister()
        identity.release(self.folder, self.rt.worker_id, self.lock)
        self.rt.notifier.close()

    # ---- the worker row -------------------------------------------------------------------

    async def _worker_loop(self) -> None:
        while True:
            await until_set(self.refresh, self.rt.settings.worker_refresh)
            self.refresh.clear()
            await self.register()

    async def _liveness_loop(self) -> None:
        """The mark of life, every ``liveness_interval``: independent of any job's heartbeat,
        so that a supervisor gone (or stopped) is seen silent within two intervals."""
        rt = self.rt
        while True:
            await asyncio.sleep(rt.settings.liveness_interval)
            try:
                await liveness.worker_alive(self.db, rt.worker_id, rt.settings.worker_ttl)
            except (DatabaseUnavailable, StatementRejected):
                pass

    async def register(self) -> None:
        """Write the worker row (and read the queue, limit and workflow gauges): with ``--rss-per-refresh``
        children's memory read at most, those read least recently first (with 500 attempts
        in flight each is read every 5 refreshes: reading every tree each time cost ~1.5% of
        a core); the others as last read."""
        rt = self.rt
        s = rt.settings
        attempts = list(rt.ledger.in_flight.values())
        children = [a.child for a in attempts if a.child is not None]
        if len(children) > s.rss_per_refresh:
            children.sort(key=lambda c: c.rss_read)
            children = children[:s.rss_per_refresh]
        for child in children:
            child.rss()
        jobs = [{"job_id": a.job_id, "attempt": a.attempt,
                 "child_pid": a.child.pid if a.child else None,
                 "rss": a.child.last_rss if a.child else 0} for a in attempts]
        try:
            await sql.worker_upsert(self.db, WorkerReport(
                id=rt.worker_id, host=socket.gethostname(), pid=os.getpid(),
                queues=list(s.queues), concurrency=s.concurrency, in_flight=len(attempts),
                status="draining" if rt.draining else self.order_status() or "running",
                ttl=s.worker_ttl, name=s.worker_name,
                jobs=jobs, job_types=self.served(),
                liveness_interval=s.liveness_interval, boot_id=identity.boot_id()))
            stalled, dead = await sql.queue_gauges(self.db, list(s.queues))
        except (DatabaseUnavailable, StatementRejected):
            return
        rt.metrics.stalled.set(stalled)
        rt.metrics.dead.set(dead)
        try:
            rt.metrics.limits_read(await sql.limit_gauges(self.db, list(s.queues)))
        except (DatabaseUnavailable, StatementRejected):
            return
        try:
            workflows = await sql.workflow_gauges(self.db)
        except (DatabaseUnavailable, StatementRejected):
            return
        for state, count in workflows.items():
            rt.metrics.workflows.labels(state).set(count)
        try:
            asleep = await sql.queue_asleep(self.db, list(s.queues))
        except (DatabaseUnavailable, StatementRejected):
            return
        rt.metrics.waits_read(list(s.queues), asleep)

    async def unregister(self) -> None:
        try:
            # During an outage, do not hold the stop up for it: the row expires by itself.
            await sql.worker_delete(self.db, self.rt.worker_id,
                                    1 if self.rt.health.down_since is not None else 5)
        except (DatabaseUnavailable, StatementRejected):
            pass

    # ---- systemd and metrics --------------------------------------------------------------

    def status(self) -> str:
        rt = self.rt
        db = ""
        if rt.health.down_since is not None:
            down = format_duration(round(rt.now() - rt.health.down_since))
            db = f", database unreachable for {down} ({rt.health.error})"
        phase = "draining" if rt.draining else self.order_status() or "serving"
        return (f"STATUS={phase} {','.join(rt.settings.queues)}: "
                f"{len(rt.ledger.in_flight)}/{rt.settings.concurrency} in flight{db}")

    async def _status_loop(self) -> None:
        """STATUS follows the in-flight count (at most once a tick); WATCHDOG from here.
        While no attempt is in flight it wakes only when one of them is due or one starts."""
        rt = self.rt
        last_status = last_watchdog = rt.now()
        last_in_flight = -1
        while True:
            now = rt.now()
            in_flight = len(rt.ledger.in_flight)
            if now - last_status >= rt.settings.worker_refresh or in_flight != last_in_flight:
                last_status = now
                last_in_flight = in_flight
                rt.notifier.notify(self.status())
                rt.metrics.in_flight.set(in_flight)
                rt.metrics.children.set(self.children())
                rt.metrics.database_up.set(0 if rt.health.down_since is not None else 1)
            wd = rt.notifier.watchdog_interval
            if wd is not None and now - last_watchdog >= wd:
                last_watchdog = now
                rt.notifier.notify("WATCHDOG=1")
            # Idle: nothing to say before the next refresh or watchdog, or an attempt's start.
            due = last_status + rt.settings.worker_refresh
            if wd is not None:
                due = min(due, last_watchdog + wd)
            await rt.ledger.tick(rt.settings.tick, max(rt.settings.tick, due - rt.now()))
