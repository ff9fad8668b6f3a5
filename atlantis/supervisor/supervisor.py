"""The supervisor: phases and signals; the work is done by its services.

    starting  -> the worker row, children, every service started, READY=1
    serving   -> until SIGTERM/SIGINT
    draining  -> no more claims; in-flight attempts get --drain-timeout to finish, then are
                 stopped and their rows given back; a second signal skips the wait
    stopping  -> outcomes written, children and zygotes gone, services stopped

Signal handlers only set flags and wake the loop. The services (see docs/architecture.md):

- claimer   claims rows for idle children, gives back orphans of lost claims
- pool      children, generations, zygotes, respawn backoff, SIGHUP
- leases    renewal, lost leases, timeouts, memory
- completer batched outcomes, row-by-row fallback
- upkeep    rescue, the worker row, LISTEN (work, cancels, pauses), systemd status
- logs      each attempt's output into atlantis.logs, bounded
- scheduler cron schedules: one job per slot, however many supervisors run
- retention deletes old finished jobs (one supervisor at a time)

A service loop that dies is logged and restarted (service.py); no fault of one attempt or
one database error stops the process.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from atlantis.protocol.messages import Stopping
from atlantis.registry import Registry
from atlantis.supervisor.attempt_logs import AttemptLogs
from atlantis.supervisor.claimer import Claimer
from atlantis.supervisor.completer import Completer
from atlantis.supervisor.leases import Leases
from atlantis.supervisor.pool import Pool
from atlantis.supervisor.retention import Retention
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.scheduler import Scheduler
from atlantis.supervisor.settings import Settings
from atlantis.supervisor.upkeep import Upkeep
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")


class Supervisor:
    def __init__(self, settings: Settings, registry: Registry, *,
                 early_signals: list[int] | None = None) -> None:
        self.settings = settings
        self.jobs = sorted(registry.registrations)
        self.decls = [d for d in registry.decls.values()
                      if d.qualified_name in registry.registrations and d.queue in settings.queues]
        self._early_signals = early_signals if early_signals is not None else []
        self.stop_signals = 0

    async def run(self) -> int:
        rt = self.rt = Runtime(self.settings)
        self.stop_event = asyncio.Event()
        self.completer = Completer(rt)
        self.logs = AttemptLogs(rt)
        self.pool = Pool(rt, self.completer, self.logs)
        self.leases = Leases(rt)
        self.claimer = Claimer(rt, self.pool, self.completer, self.jobs)
        self.upkeep = Upkeep(rt, self.completer, lambda: len(self.pool.children))
        self.scheduler = Scheduler(rt, self.decls)
        self.retention = Retention(rt)
        rt.health.on_change = self._health_changed
        services = (self.completer, self.logs, self.leases, self.upkeep, self.claimer,
                    self.scheduler, self.retention)
        # -- starting
        loop = rt.loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        for _ in self._early_signals:
            self._on_stop_signal()
        s = self.settings
        if s.metrics_port:
            rt.metrics.serve(s.metrics_port, s.metrics_host)
            log.info("metrics on http://%s:%d/metrics", s.metrics_host, s.metrics_port)
        await self.upkeep.register()
        self.pool.ensure()
        log.info("supervisor %s serving queues %s with %d children (isolation %s)",
                 rt.worker_id, ",".join(s.queues), s.concurrency, s.isolation,
                 extra={"worker": rt.worker_id})
        for service in services:
            service.start()
        rt.notifier.notify("READY=1", self.upkeep.status())
        # -- serving
        await self.stop_event.wait()
        # -- draining
        await self._drain()
        # -- stopping
        await self.logs.drain()
        await self.completer.drain(s.flush_timeout)
        await self.pool.shutdown()
        for service in services:
            await service.stop()
        await self.upkeep.unregister()
        await rt.close_databases()
        rt.notifier.close()
        log.info("supervisor %s stopped", rt.worker_id)
        return 0

    def _on_stop_signal(self) -> None:
        self.stop_signals += 1
        self.stop_event.set()
        self.rt.changed.set()

    def _on_hup(self) -> None:
        if not self.rt.draining:
            self.pool.reload()

    def _health_changed(self) -> None:
        """The database became unreachable or reachable again: tell systemd at once."""
        rt = self.rt
        rt.notifier.notify(self.upkeep.status())
        if rt.health.down_since is None:
            rt.wake.set()  # claim what was enqueued meanwhile (its NOTIFYs may be lost)
            self.completer.flush.set()

    async def _drain(self) -> None:
        rt = self.rt
        rt.draining = True
        self.claimer.give_back_held()
        rt.wake.set()
        rt.notifier.notify("STOPPING=1", self.upkeep.status())
        log.info("draining: %d attempts in flight, waiting up to %s", len(rt.in_flight),
                 format_duration(self.settings.drain_timeout))
        for a in rt.in_flight.values():  # ctx.stopping: a handler may yield (Snooze(0))
            if a.child is not None:
                a.child.send(Stopping(job_id=a.job_id))
        deadline = rt.now() + self.settings.drain_timeout
        seen = min(self.stop_signals, 1)  # two signals before the drain: no wait
        while rt.in_flight and rt.now() < deadline and self.stop_signals == seen:
            await rt.wait_changed(deadline - rt.now())
        hurry = self.stop_signals > seen
        for a in list(rt.in_flight.values()):
            log.warning("%s: still running at the end of the drain; stopping it and releasing "
                        "the row", a.tag(), extra=a.log_extra())
            a.stop("drain", rt.now(), sig=signal.SIGKILL if hurry else signal.SIGTERM)
        while rt.in_flight:
            if self.stop_signals > seen + 1:
                for a in rt.in_flight.values():
                    a.stop("drain", rt.now(), sig=signal.SIGKILL)
            await rt.wait_changed(0.1)
