"""How the supervisor's loops wait: for an event, at most some seconds (woken early by it)."""

from __future__ import annotations

import asyncio


async def until_set(event: asyncio.Event, seconds: float) -> None:
    """Return once ``event`` is set, or after ``seconds`` (0 or less: at once, unless set)."""
    try:
        await asyncio.wait_for(event.wait(), max(seconds, 0.0))
    except TimeoutError:
        pass
