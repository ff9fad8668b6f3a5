"""The supervisor: phases and signals; the work is done by its services.

    starting  -> every service started in the order of :meth:`Supervisor.services`, READY=1
    serving   -> until SIGTERM/SIGINT; SIGHUP reloads the app (:mod:`reload`)
    draining  -> no more claims; the services stop in reverse order, each finishing its work
                 first: in-flight attempts get --drain-timeout to finish, then are stopped and
                 their rows given back (a second signal skips the wait); outcomes are
                 written; children and zygotes go; the worker row last

Signal handlers only set flags and wake the loop. The services (see docs/architecture.md),
in starting order:

- readiness   /ready and /live on --ready-port: 503 until serving and again once draining
- presence    metrics, the worker row, systemd status and watchdog
- completer   outcomes written in batches, row-by-row fallback
- logs        each attempt's output into atlantis.logs, bounded
- leases      renewal, lost leases, checkpoints written
- enforcement timeouts, cancel and kill graces, memory and task limits
- control     LISTEN (new work, cancels, pauses, orders) and the fallback polls
- orders      an operator's drain or eviction of this supervisor (kept across restarts)
- pool        children, generations, zygotes, respawn backoff; it drains at stop
- rescue      rows whose lease expired, any supervisor's
- claimer     claims rows for idle children (and a few ahead), gives back orphans
- scheduler   cron schedules: one job per slot, however many supervisors run
- retention   deletes old finished jobs (one supervisor at a time)

What every attempt is at any moment is the ledger's (:mod:`ledger`). A service loop that
dies is logged and restarted (service.py); no fault of one attempt or one database error
stops the process.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from atlantis.registry import Registry
from atlantis.supervisor.attempt_logs import AttemptLogs
from atlantis.supervisor.claimer import Claimer
from atlantis.supervisor.completer import Completer
from atlantis.supervisor.control import Control
from atlantis.supervisor.enforcement import Enforcement
from atlantis.supervisor.leases import Leases
from atlantis.supervisor.orders import Orders
from atlantis.supervisor.pool import Pool
from atlantis.supervisor.presence import Presence
from atlantis.supervisor.readiness import Readiness
from atlantis.supervisor.reload import Reloader, limited_jobs, served
from atlantis.supervisor.rescue import Rescue
from atlantis.supervisor.retention import Retention
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.scheduler import Scheduler
from atlantis.supervisor.service import Service
from atlantis.supervisor.settings import Settings

log = logging.getLogger("atlantis.supervisor")


class Supervisor:
    def __init__(self, settings: Settings, registry: Registry, *,
                 early_signals: list[int] | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self._early_signals = early_signals if early_signals is not None else []

    def services(self, rt: Runtime) -> list[Service]:
        """Every service, in starting order; they stop in reverse."""
        jobs = sorted(self.registry.registrations)
        decls = served(list(self.registry.decls.values()), jobs, self.settings.queues)
        rt.claim_mode.limited_jobs = limited_jobs(list(self.registry.decls.values()))
        self.readiness = Readiness(rt)
        logs = AttemptLogs(rt)
        completer = Completer(rt, logs)
        pool = Pool(rt, logs, jobs)
        jobset = pool.jobset
        self.presence = presence = Presence(rt, lambda: len(pool.children),
                                            lambda: jobset.claimed)
        jobset.on_change = presence.refresh.set
        scheduler = Scheduler(rt, decls)
        self.reloader = Reloader(rt, pool, scheduler, jobs)
        self.flush = completer.flush
        claimer = Claimer(rt, lambda: jobset.claimed, pool.idle, pool.feed)
        orders = Orders(rt, presence.refresh.set, self._request_stop)
        presence.order_status = orders.status
        return [self.readiness, presence, completer, logs, Leases(rt), Enforcement(rt),
                Control(rt), orders,
                pool, Rescue(rt, completer.flush), claimer, scheduler, Retention(rt)]

    async def run(self) -> int:
        rt = self.rt = Runtime(self.settings)
        self.stopped = asyncio.Event()
        services = self.services(rt)
        rt.health.on_change = self._health_changed
        # -- starting
        loop = rt.loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self.reloader.request)
        for _ in self._early_signals:
            self._on_stop_signal()
        s = self.settings
        for service in services:
            await service.start()
        log.info("supervisor %s serving queues %s with %d children (isolation %s)",
                 rt.worker_id, ",".join(s.queues), s.concurrency, s.isolation,
                 extra={"worker": rt.worker_id})
        rt.notifier.notify("READY=1", self.presence.status())
        self.readiness.serving = True
        # -- serving
        await self.stopped.wait()
        # -- draining
        self.reloader.cancel()
        rt.draining = True
        rt.notifier.notify("STOPPING=1", self.presence.status())
        for service in reversed(services):
            await service.stop()
        await rt.close_databases()
        log.info("supervisor %s stopped", rt.worker_id)
        return 0

    def _request_stop(self) -> None:
        """Stop as on SIGTERM, without counting a signal (``tide worker drain --exit``)."""
        self.stopped.set()
        self.rt.changed.set()

    def _on_stop_signal(self) -> None:
        self.rt.stop_signals += 1
        self.stopped.set()
        self.rt.changed.set()

    def _health_changed(self) -> None:
        """The database became unreachable or reachable again: tell systemd at once."""
        rt = self.rt
        rt.notifier.notify(self.presence.status())
        if rt.health.down_since is None:
            rt.wake.set()  # claim what was enqueued meanwhile (its NOTIFYs may be lost)
            self.flush.set()
