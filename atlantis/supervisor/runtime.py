"""What the supervisor's services share: settings, identity, attempts in flight, signals.

One object, passed to every service, instead of services reaching into each other: the
claimer adds attempts, the pool runs them, the leases service keeps them alive, the
completer writes their outcomes, the upkeep service reports on all of it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections import deque
from dataclasses import dataclass, field

from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.db import Db, Health
from atlantis.supervisor.metrics import Metrics
from atlantis.supervisor.policy import Limits
from atlantis.supervisor.settings import Settings
from atlantis.supervisor.systemd import Notifier


def new_worker_id() -> str:
    """A fresh id per supervisor run, never reused: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(eq=False)
class Runtime:
    settings: Settings
    worker_id: str = field(default_factory=new_worker_id)
    metrics: Metrics = field(default_factory=Metrics)
    notifier: Notifier = field(default_factory=Notifier)
    health: Health = field(default_factory=Health)
    in_flight: dict[int, Attempt] = field(default_factory=dict)
    held: deque[Attempt] = field(default_factory=deque)
    """Rows claimed ahead of need (not in flight yet): the next idle child starts the first.
    Their leases are not renewed: each is started or given back within claim_ahead_hold,
    well inside its first lease."""
    typical_attempt: float | None = None
    """A moving average of how long attempts take (seconds): rows are claimed ahead only
    while it is short."""
    attempts_ended: int = 0
    """Attempts that ended in a child so far (a child became free)."""
    lost_ids: set[int] = field(default_factory=set)
    """Jobs whose attempt lost its lease: never released, left to be rescued."""
    draining: bool = False
    paused: set[str] = field(default_factory=set)
    """Served queues an operator paused: not claimed from until resumed."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Wakes the claimer: a child became idle, work was announced, the database is back."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Something the drain waits for changed (an attempt ended, a child exited)."""

    def __post_init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.limits = Limits(max_snooze=self.settings.max_snooze,
                             max_backoff=self.settings.max_backoff,
                             max_memory=self.settings.max_memory_per_child,
                             max_tasks=self.settings.max_tasks_per_child)
        self._dbs: list[Db] = []

    def db(self, role: str) -> Db:
        """A connection of its own for ``role``: a slow statement never delays another role's."""
        conn = Db(self.settings.database_url, role, self.health)
        self._dbs.append(conn)
        return conn

    async def close_databases(self) -> None:
        for conn in self._dbs:
            await conn.close()

    def now(self) -> float:
        return self.loop.time()

    async def wait_changed(self, timeout: float) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), max(timeout, 0.0))
        except TimeoutError:
            pass
