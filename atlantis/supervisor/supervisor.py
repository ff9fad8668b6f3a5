"""The supervisor: phases and signals; the work is done by its services.

    starting  -> the worker row, children, every service started, READY=1
    serving   -> until SIGTERM/SIGINT; SIGHUP reloads the app (see _reload)
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

import psycopg

from atlantis.declarations.model import JobDecl
from atlantis.protocol.messages import Stopping
from atlantis.registry import Registry
from atlantis.store import connect, sync
from atlantis.store.database import describe_db_error
from atlantis.supervisor import appload
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

SYNC_TIMEOUT = 60.0
"""The longest a reload waits for its declarations to be stored."""


def _sync(url: str, decls: list[JobDecl]) -> None:
    """Store the declarations, as the start does (in a thread: psycopg's blocking API)."""
    with connect(url, connect_timeout=5) as conn:
        sync(conn, decls)


class Supervisor:
    def __init__(self, settings: Settings, registry: Registry, *,
                 early_signals: list[int] | None = None) -> None:
        self.settings = settings
        self.jobs = sorted(registry.registrations)
        self.decls = self._served_decls(list(registry.decls.values()), self.jobs)
        self._early_signals = early_signals if early_signals is not None else []
        self.stop_signals = 0
        self._reloading: asyncio.Task[None] | None = None
        self._reload_again = False

    def _served_decls(self, decls: list[JobDecl], jobs: list[str]) -> list[JobDecl]:
        """The declarations this supervisor serves: a handler, on one of its queues."""
        handled = set(jobs)
        return [d for d in decls
                if d.qualified_name in handled and d.queue in self.settings.queues]

    async def run(self) -> int:
        rt = self.rt = Runtime(self.settings)
        self.stop_event = asyncio.Event()
        self.completer = Completer(rt)
        self.logs = AttemptLogs(rt)
        self.pool = Pool(rt, self.completer, self.logs, self.jobs)
        self.leases = Leases(rt)
        jobset = self.pool.jobset
        self.claimer = Claimer(rt, self.pool, self.completer, lambda: jobset.claimed)
        self.upkeep = Upkeep(rt, self.completer, lambda: len(self.pool.children),
                             lambda: jobset.claimed)
        jobset.on_change = self.upkeep.refresh.set
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
        if self._reloading is not None:
            self._reloading.cancel()
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
        if self.rt.draining:
            return
        if self._reloading is not None and not self._reloading.done():
            self._reload_again = True  # once the current one is done: the code may have moved on
            return
        self._reloading = asyncio.create_task(self._reload(), name="reload")

    async def _reload(self) -> None:
        """SIGHUP: load the app again, store its declarations, serve its jobs.

        The app is imported in a fresh interpreter (:mod:`appload`): one that fails to load
        (a syntax error, a bad ``.atl``, no handler) is one line in the log, and the
        children, the jobs claimed and the schedules stay as they were. Otherwise its
        declarations are synced as at start, the scheduler follows its schedules, and the
        children are replaced (:meth:`Pool.reload`): new ones say which jobs they have a
        handler for, and from the first one ready on those are the jobs claimed. Attempts
        in flight finish in their old children. Supervisor flags are not reloaded.
        """
        while True:
            self._reload_again = False
            try:
                await self._reload_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop the supervisor
                log.exception("SIGHUP: the reload failed; the children and jobs stay as they were")
            if not self._reload_again or self.rt.draining:
                return

    async def _reload_once(self) -> None:
        s = self.settings
        try:
            app = await appload.load(s.app, self.pool.env)
        except appload.AppLoadError as exc:
            log.error("SIGHUP: the app could not be loaded, so the children and jobs stay as "
                      "they were: %s", exc)
            return
        if self.rt.draining:
            return
        try:
            await asyncio.wait_for(asyncio.to_thread(_sync, s.database_url, app.decls),
                                   SYNC_TIMEOUT)
        except (psycopg.Error, TimeoutError) as exc:
            why = (describe_db_error(exc, s.database_url) if isinstance(exc, psycopg.Error)
                   else f"no answer within {format_duration(SYNC_TIMEOUT)}")
            log.error("SIGHUP: the declarations could not be stored (%s), so the children and "
                      "jobs stay as they were", why)
            return
        if self.rt.draining:
            return
        added = sorted(set(app.jobs) - set(self.jobs))
        removed = sorted(set(self.jobs) - set(app.jobs))
        log.info("SIGHUP: app loaded, declarations synced (%d), jobs with a handler (%d)%s%s",
                 len(app.decls), len(app.jobs),
                 f" (new: {', '.join(added)})" if added else "",
                 f" (removed: {', '.join(removed)})" if removed else "")
        self.jobs = app.jobs
        self.decls = self._served_decls(app.decls, app.jobs)
        self.scheduler.update(self.decls)
        self.pool.reload(app.jobs)

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
