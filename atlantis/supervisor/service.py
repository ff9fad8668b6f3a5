"""Services: each does one job in loops of its own, started and stopped the same way.

The contract: ``await start()`` once, in the order of the supervisor's list (a service may
rely on those before it); ``await stop()`` once, in reverse, and a service with work in
hand finishes it inside ``stop`` (the pool drains its attempts, the completer writes its
outcomes) before its loops are cancelled.

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


class Service:
    name = "service"

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._tasks: list[asyncio.Task[None]] = []
        self.restarts = 0

    def loops(self) -> list[Loop]:
        """The coroutines this service runs while it is started."""
        return []

    async def start(self) -> None:
        """Start the loops (a service may do more first, such as registering itself)."""
        self.start_loops()

    def start_loops(self) -> None:
        for loop in self.loops():
            name = f"{self.name}.{loop.__name__.lstrip('_')}"
            self._tasks.append(asyncio.create_task(self._supervised(loop, name), name=name))

    async def stop(self) -> None:
        """Finish the work in hand (overridden where there is some), then end the loops."""
        await self.cancel_loops()

    async def finish_loops(self, timeout: float) -> None:
        """Let the loops end by themselves (they watch ``rt.draining``) within ``timeout``
        seconds; then cancel what is left."""
        if self._tasks and timeout > 0:
            await asyncio.wait(self._tasks, timeout=timeout)
        await self.cancel_loops()

    async def cancel_loops(self) -> None:
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
                if self.rt.now() - started >= self.rt.settings.healthy_after:
                    failures = 0
                failures += 1
                self.restarts += 1
                delay = backoff(0.1, failures, cap=self.rt.settings.respawn_max)
                log.exception("internal error in %s; restarting it in %.1fs (the supervisor "
                              "keeps serving)", name, delay)
                await asyncio.sleep(delay)
