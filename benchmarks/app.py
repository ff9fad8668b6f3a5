"""The benchmark's app: a no-op handler, so the numbers measure atlantis itself, and a
sleeping one for the many-leases run (heartbeat 3 s)."""

from __future__ import annotations

import time
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("bench.atl")


@registry.handler("bench.Noop")
def noop(ctx: atlantis.JobContext, args: Any) -> None:
    return None


@registry.handler("bench.Sleep")
def sleep(ctx: atlantis.JobContext, args: Any) -> None:
    """Sleep ``args.seconds``, or until the supervisor drains (then return early)."""
    until = time.monotonic() + float(args.seconds)
    while time.monotonic() < until and not ctx.stopping:
        time.sleep(0.2)
