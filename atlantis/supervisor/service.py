"""Services: each does one job in loops of its own, started and stopped the same way.

A loop that dies of an unexpected exception is a bug in atlantis, not a reason to stop
serving: it is logged with its traceback and restarted with backoff. Only the supervisor's
phases (see supervisor.py) decide when the process stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from atlantis.supervisor.policy import backoff
from atlantis.supervisor.runtime import Runtime

log = logging.getLogger("atlantis.supervisor")

Loop = Callable[[], Coroutine[Any, Any, None]]

HEALTHY_AFTER = 60.0
"""A loop that ran this long before failing starts its backoff afresh."""


class Service:
    name = "service"

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._tasks: list[asyncio.Task[None]] = []
        self.restarts = 0

    def loops(self) -> list[Loop]:
        """The coroutines this service runs while it is started."""
        return []

    def start(self) -> None:
        for loop in self.loops():
            name = f"{self.name}.{loop.__name__.lstrip('_')}"
            self._tasks.append(asyncio.create_task(self._supervised(loop, name), name=name))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _supervised(self, loop: Loop, name: str) -> None:
        failures = 0
        while True:
            started = self.rt.now()
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                if self.rt.now() - started >= HEALTHY_AFTER:
                    failures = 0
                failures += 1
                self.restarts += 1
                delay = backoff(0.1, failures, cap=self.rt.settings.respawn_max)
                log.exception("internal error in %s; restarting it in %.1fs (the supervisor "
                              "keeps serving)", name, delay)
                await asyncio.sleep(delay)
