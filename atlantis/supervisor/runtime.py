"""What the supervisor's services share: settings, identity, the ledger, the phase, events.

One object, passed to every service, instead of services reaching into each other. The
attempts themselves are the ledger's (:mod:`ledger`): the claimer holds them, the pool runs
them, leases keep them alive, enforcement stops them, the completer writes their outcomes.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from dataclasses import dataclass, field

from atlantis.supervisor.claimmode import ClaimMode
from atlantis.supervisor.db import Db, Health, Timing
from atlantis.supervisor.ledger import Ledger
from atlantis.supervisor.metrics import Metrics
from atlantis.supervisor.policy import Limits
from atlantis.supervisor.settings import Settings
from atlantis.supervisor.systemd import Notifier
from atlantis.supervisor.waiting import until_set


def new_worker_id() -> str:
    """A fresh id per supervisor run, never reused: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(eq=False)
class Runtime:
    settings: Settings
    worker_id: str = field(default_factory=new_worker_id)
    metrics: Metrics = field(default_factory=Metrics)
    notifier: Notifier = field(default_factory=Notifier)
    draining: bool = False
    """The phase: set once, when the drain begins (no more claims)."""
    stop_signals: int = 0
    """SIGTERM/SIGINT received: a second one during the drain hurries it."""
    held: str | None = None
    """An operator's order (``drain`` or ``evict``, :mod:`orders`): no claims until resumed."""
    orders_wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Look up this supervisor's order now (a NOTIFY named it)."""
    paused: set[str] = field(default_factory=set)
    """Served queues an operator paused: not claimed from until resumed."""
    claim_mode: ClaimMode = field(default_factory=ClaimMode)
    """The claimer's mode: limited jobs and queues, rows ahead, idle children kept."""
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
        self._timing = Timing.of(self.settings)
        self.health = Health(self._timing.outage_report_every)
        self.ledger = Ledger(self.settings, self.metrics, self.now, self.worker_id)
        self.ledger.on_change = self.changed.set

    def db(self, role: str) -> Db:
        """The connection of ``role``, made on first use: a slow statement never delays
        another role's. Services that ask for the same role share it (one statement at a
        time: rescue and the worker row, which are both seldom and short)."""
        for conn in self._dbs:
            if conn.role == role:
                return conn
        conn = Db(self.settings.role_url(role), role, self._timing, self.health,
                  pooled=self.settings.pooled
                  and self.settings.role_url(role) == self.settings.database_url)
        self._dbs.append(conn)
        return conn

    async def close_databases(self) -> None:
        for conn in self._dbs:
            await conn.close()

    @property
    def claiming(self) -> bool:
        """Whether rows may be claimed: neither draining (a stop) nor held by an order."""
        return not self.draining and self.held is None

    def now(self) -> float:
        return self.loop.time()

    async def wait_changed(self, timeout: float) -> None:
        self.changed.clear()
        await until_set(self.changed, timeout)
