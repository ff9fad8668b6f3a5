"""The benchmark's apps: a no-op handler, so the numbers measure atlantis itself, and a
sleeping one for the many-leases run (heartbeat 3 s); and, apart (``limited``), the no-op
job under a concurrency limit, for ``python -m benchmarks.limits``."""

from __future__ import annotations

import time
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("bench.atl")

limited = atlantis.Registry.from_atl("limited.atl")
"""``bench.NoopPerAccount`` (``concurrency 1 by account``) alone: a supervisor serving a
limited job claims nothing ahead, which the plain benchmarks must not pay."""


@registry.handler("bench.Noop")
def noop(ctx: atlantis.JobContext, args: Any) -> None:
    return None


@limited.handler("bench.NoopPerAccount")
def noop_per_account(ctx: atlantis.JobContext, args: Any) -> None:
    return None


@registry.handler("bench.Sleep")
def sleep(ctx: atlantis.JobContext, args: Any) -> None:
    """Sleep ``args.seconds``, or until the supervisor drains (then return early)."""
    until = time.monotonic() + float(args.seconds)
    while time.monotonic() < until and not ctx.stopping:
        time.sleep(0.2)
