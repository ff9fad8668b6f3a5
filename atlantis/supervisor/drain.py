"""The drain: attempts in flight get ``--drain-timeout`` to finish; then they are stopped.

Each handler is told once (``ctx.stopping``: it may yield with ``Snooze(0)``). Attempts
still running at the end of the wait are stopped (SIGTERM, then SIGKILL after the kill
grace) and their rows given back unspent. A second SIGTERM/SIGINT skips the wait and a third
kills at once; two signals before the drain began skip the wait too.
"""

from __future__ import annotations

import logging
import signal

from atlantis.supervisor.runtime import Runtime
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")


async def drain(rt: Runtime) -> None:
    in_flight = rt.ledger.in_flight
    log.info("draining: %d attempts in flight, waiting up to %s", len(in_flight),
             format_duration(rt.settings.drain_timeout))
    for a in in_flight.values():
        a.tell_stopping()
    deadline = rt.now() + rt.settings.drain_timeout
    seen = min(rt.stop_signals, 1)  # two signals before the drain: no wait
    while in_flight and rt.now() < deadline and rt.stop_signals == seen:
        await rt.wait_changed(deadline - rt.now())
    hurry = rt.stop_signals > seen
    for a in list(in_flight.values()):
        log.warning("%s: still running at the end of the drain; stopping it and releasing "
                    "the row", a.tag(), extra=a.log_extra())
        a.stop("drain", rt.now(), sig=signal.SIGKILL if hurry else signal.SIGTERM)
    while in_flight:
        if rt.stop_signals > seen + 1:
            for a in in_flight.values():
                a.stop("drain", rt.now(), sig=signal.SIGKILL)
        await rt.wait_changed(0.1)
