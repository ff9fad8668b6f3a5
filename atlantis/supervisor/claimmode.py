"""The claimer's mode, in one object: what the claimer, the pool and the completer must agree
on about limits and rows held ahead.

The claimer sets ``ahead`` and ``idle_reserved`` each round; the pool reads
``idle_reserved`` (it starts no row held ahead in the children kept for the limited claim)
and the completer ``ahead`` (it lingers a little to batch results when none are held). The
limited sets come from the app (``limited_jobs``: set at start and by a reload) and from the
database (``limited_queues``: ``tide queue limit``, polled by the control service).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(eq=False)
class ClaimMode:
    limited_queues: set[str] = field(default_factory=set)
    """Served queues with a queue-wide concurrency limit (tide queue limit)."""
    limited_jobs: frozenset[str] = frozenset()
    """Jobs of the app that declare limits (concurrency, rate)."""
    ahead: bool = True
    """Whether the claimer may hold rows ahead (not while rows of limited jobs or queues wait
    for its children): when it may not, the completer lingers a little to batch results."""
    idle_reserved: int = 0
    """Idle children the pool keeps for the claimer's limited claim (rows of limited jobs or
    queues are never claimed ahead, so they need idle children): it starts no row held
    ahead in them. One while the claimer waits for a child to fall idle, those it offered
    while that claim is under way (see supervisor/claimer.py)."""

    def limits_any(self, queues: Iterable[str], jobs: Iterable[str]) -> bool:
        """Whether a limit applies to any of these queues or jobs."""
        return bool(self.limited_jobs.intersection(jobs)
                    or self.limited_queues.intersection(queues))

    def unlimited(self, queues: Iterable[str],
                  jobs: Iterable[str]) -> tuple[list[str], list[str]]:
        """The queues and jobs no limit applies to: their rows alone may be held ahead."""
        return ([q for q in queues if q not in self.limited_queues],
                [j for j in jobs if j not in self.limited_jobs])
