"""Orders: an operator's drain or eviction of this one supervisor, carried by the database.

``tide worker drain|evict|resume ID`` and the console's worker page keep an order for the
supervisor's name (``--name``: store/orders.py, live/workers.sql). This service adopts the
order kept for its name at start (a drained supervisor that restarted starts drained), and
looks it up again when a NOTIFY names this run (control.py) and every ``--pause-poll``:

- ``drain``: no more claims (rows held ahead are given back at once, unspent); each handler
  in flight is told, as by a stop's drain (``ctx.stopping``), and its attempt is let finish.
  Once nothing is in flight the supervisor is *drained*: it stays up and idle, its worker row
  says ``drained``, so that a restart policy does not undo the order, until it is resumed or
  stopped. With ``--exit`` the run it was given to then stops as on SIGTERM.
- ``evict``: the same, but the attempts in flight are stopped now, as at the end of a drain
  timeout (SIGTERM, SIGKILL after ``--kill-grace``), and their rows given back unspent.
- no order (resumed): claims again at once.

A supervisor evicted while it was silent obeys when it wakes; meanwhile its leases rule (the
rescue releases its rows when they end, never sooner).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from atlantis.store import orders as sql
from atlantis.store.orders import MyOrder
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.supervisor.waiting import until_set

log = logging.getLogger("atlantis.supervisor")

#: How often, while attempts finish under an order, it is checked whether none is left.
_SETTLE_EVERY = 0.1


class Orders(Service):
    name = "orders"

    def __init__(self, rt: Runtime, on_change: Callable[[], None],
                 stop: Callable[[], None]) -> None:
        super().__init__(rt)
        self.db = rt.db("poll")  # shared with control's polls: seldom and short
        self.on_change = on_change
        """The worker row and systemd's status say what changed (presence)."""
        self.stop_now = stop
        """Stop the supervisor as on SIGTERM (``--exit``, once drained)."""
        self.order: MyOrder | None = None
        self._drained_for: str | None = None
        """The action whose drained state was recorded (once per order)."""

    def loops(self) -> list[Loop]:
        return [self._order_loop]

    async def start(self) -> None:
        """Adopt the order kept for this name before the first claim."""
        rt = self.rt
        try:
            order = await sql.adopt(self.db, rt.worker_id, rt.settings.worker_name)
        except (DatabaseUnavailable, StatementRejected) as exc:
            log.warning("could not look up an order for %s at start (%s): looking again "
                        "within %ss", rt.settings.worker_name, exc, rt.settings.pause_poll)
        else:
            if order is not None:
                log.warning("supervisor %s starts drained: an operator's %s order is kept for "
                            "its name; tide worker resume %s lifts it", rt.worker_id,
                            order.action, rt.settings.worker_name)
            self._apply(order)
        await super().start()

    async def _order_loop(self) -> None:
        rt = self.rt
        looked = rt.now()
        while True:
            every = rt.settings.pause_poll
            if rt.held is not None and self._drained_for is None:
                every = _SETTLE_EVERY  # attempts are finishing: say drained at once
            await until_set(rt.orders_wake, every)
            # On a NOTIFY naming this run, and every --pause-poll (a lost NOTIFY).
            if rt.orders_wake.is_set() or rt.now() - looked >= rt.settings.pause_poll:
                rt.orders_wake.clear()
                looked = rt.now()
                await self._look_up()
            await self._settle()

    async def _look_up(self) -> None:
        rt = self.rt
        try:
            order = await sql.read(self.db, rt.worker_id, rt.settings.worker_name)
        except (DatabaseUnavailable, StatementRejected):
            return
        self._apply(order)

    def _apply(self, order: MyOrder | None) -> None:
        rt = self.rt
        was = self.order
        self.order = order
        if order == was:
            return
        ledger = rt.ledger
        if order is None:
            rt.held = None
            self._drained_for = None
            log.warning("supervisor %s resumed by an operator: claiming again", rt.worker_id)
            rt.wake.set()
            self.on_change()
            return
        rt.held = order.action
        if was is None or was.action != order.action:
            self._drained_for = None
        given = ledger.give_back_held()
        in_flight = list(ledger.in_flight.values())
        if order.action == "evict":
            log.warning("supervisor %s evicted by an operator: stopping %d attempts, giving "
                        "their rows back, claiming nothing", rt.worker_id, len(in_flight))
            for a in in_flight:
                a.stop("drain", rt.now())
        else:
            log.warning("supervisor %s drained by an operator: %d attempts in flight finish, "
                        "nothing more is claimed%s", rt.worker_id, len(in_flight),
                        " (then it exits)" if order.exit_when_drained else "")
            for a in in_flight:
                a.tell_stopping()
        if given:
            log.info("gave back %d rows claimed ahead (an operator's %s)", given, order.action)
        self.on_change()

    async def _settle(self) -> None:
        """Once nothing is in flight under an order: record it drained, and stop with --exit."""
        rt = self.rt
        order = self.order
        if order is None or rt.ledger.in_flight or self._drained_for == order.action:
            return
        try:
            await sql.drained(self.db, rt.settings.worker_name, order.action)
        except (DatabaseUnavailable, StatementRejected):
            return
        self._drained_for = order.action
        log.warning("supervisor %s is drained: idle until tide worker resume %s%s",
                    rt.worker_id, rt.settings.worker_name,
                    "; exiting (--exit)" if order.exit_when_drained else "")
        self.on_change()
        if order.exit_when_drained:
            self.stop_now()

    def status(self) -> str | None:
        """The worker row's status under an order: draining, then drained."""
        if self.order is None:
            return None
        return "drained" if self._drained_for is not None else "draining"
