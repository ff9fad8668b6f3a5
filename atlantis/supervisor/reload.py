"""SIGHUP: load the app again, store its declarations, serve its jobs.

The app is imported in a fresh interpreter (:mod:`appload`): one that fails to load (a
syntax error, a bad ``.atl``, no handler) is one line in the log, and the children, the jobs
claimed and the schedules stay as they were. Otherwise its declarations are synced as at
start, the scheduler follows its schedules, and the children are replaced
(:meth:`Pool.reload`): new ones say which jobs they have a handler for, and from the first
one ready on those are the jobs claimed. Attempts in flight finish in their old children.
Supervisor flags are not reloaded. A SIGHUP during a reload runs one more once it is done
(the code may have moved on).
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from atlantis.declarations.model import JobDecl, WorkflowDecl
from atlantis.store import connect, sync
from atlantis.store.database import describe_db_error
from atlantis.supervisor import appload
from atlantis.supervisor.pool import Pool
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.scheduler import Scheduler
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")


def _sync(url: str, decls: list[JobDecl], workflows: list[WorkflowDecl]) -> None:
    """Store the declarations, as the start does (in a thread: psycopg's blocking API)."""
    with connect(url, connect_timeout=5) as conn:
        sync(conn, decls, workflows)


def limited_jobs(decls: list[JobDecl]) -> frozenset[str]:
    """The jobs that declare limits (their rows are claimed by ``claim_limited``)."""
    return frozenset(d.qualified_name for d in decls if d.limits)


def served(decls: list[JobDecl], jobs: list[str], queues: tuple[str, ...]) -> list[JobDecl]:
    """The declarations a supervisor serves: a handler, on one of its queues."""
    handled = set(jobs)
    return [d for d in decls if d.qualified_name in handled and d.queue in queues]


class Reloader:
    def __init__(self, rt: Runtime, pool: Pool, scheduler: Scheduler, jobs: list[str]) -> None:
        self.rt = rt
        self.pool = pool
        self.scheduler = scheduler
        self.jobs = jobs
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        """A SIGHUP: reload now, or once the reload under way is done."""
        if self.rt.draining:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.create_task(self._reload(), name="reload")

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _reload(self) -> None:
        while True:
            self._again = False
            try:
                await self._reload_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop the supervisor
                log.exception("SIGHUP: the reload failed; the children and jobs stay as they were")
            if not self._again or self.rt.draining:
                return

    async def _reload_once(self) -> None:
        s = self.rt.settings
        try:
            app = await appload.load(s.app, self.pool.env)
        except appload.AppLoadError as exc:
            log.error("SIGHUP: the app could not be loaded, so the children and jobs stay as "
                      "they were: %s", exc)
            return
        if self.rt.draining:
            return
        try:
            await asyncio.wait_for(
                asyncio.to_thread(_sync, s.database_url, app.decls, app.workflows),
                s.reload_timeout)
        except (psycopg.Error, TimeoutError) as exc:
            why = (describe_db_error(exc, s.database_url) if isinstance(exc, psycopg.Error)
                   else f"no answer within {format_duration(s.reload_timeout)}")
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
        self.rt.claim_mode.limited_jobs = limited_jobs(app.decls)
        self.scheduler.update(served(app.decls, app.jobs, s.queues))
        self.pool.reload(app.jobs)
