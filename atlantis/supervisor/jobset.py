"""Which jobs a supervisor claims, across reloads (SIGHUP).

Each child says in its ``Ready`` which jobs its import of the app has a handler for. The
jobs claimed are those of the newest generation that has a ready child: after a reload the
old children serve the old set until a new child is ready, and from then on only the new
set is claimed (the old children still run rows of it they have a handler for, until they
retire). Before any child is ready: the jobs of the app as loaded.

The set is worked out again only when a child becomes ready or goes away
(:meth:`JobSet.update`), never per claim: the claimer reads :attr:`JobSet.claimed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atlantis.supervisor.children import Child

log = logging.getLogger("atlantis.supervisor")


class JobSet:
    def __init__(self, jobs: Iterable[str]) -> None:
        self.configured = frozenset(jobs)
        """The jobs of the app as last loaded (at start, or by the last successful reload)."""
        self.claimed: list[str] = sorted(self.configured)
        """The jobs to claim now, sorted."""
        self.on_change: Callable[[], None] = lambda: None
        """Called when :attr:`claimed` changed (the worker row says so at once)."""

    @staticmethod
    def runs(child: Child, job: str) -> bool:
        """Whether ``child`` has a handler for ``job`` (a child that did not say: any)."""
        return child.jobs is None or job in child.jobs

    def reload(self, jobs: Iterable[str], children: Iterable[Child]) -> None:
        """The app was loaded again: ``jobs`` have a handler now."""
        self.configured = frozenset(jobs)
        self.update(children)

    def update(self, children: Iterable[Child]) -> None:
        """Work the set out again (a child became ready or went away); log what changed."""
        claimed = self._work_out(children)
        if claimed == self.claimed:
            return
        added = sorted(set(claimed) - set(self.claimed))
        removed = sorted(set(self.claimed) - set(claimed))
        self.claimed = claimed
        log.info("now claiming jobs of %d types%s%s", len(claimed),
                 f"; added {', '.join(added)}" if added else "",
                 f"; removed {', '.join(removed)}" if removed else "")
        self.on_change()

    def _work_out(self, children: Iterable[Child]) -> list[str]:
        ready = [c for c in children if c.state in ("idle", "busy") and c.jobs is not None]
        if not ready:
            return sorted(self.configured)
        newest = max(c.generation for c in ready)
        jobs: set[str] = set()
        for c in ready:
            if c.generation == newest and c.jobs is not None:
                jobs |= c.jobs
        return sorted(jobs)
