"""The benchmark's apps: a no-op handler, so the numbers measure atlantis itself, and a
sleeping one for the many-leases run (heartbeat 3 s); and, apart (``limited``), the no-op
job under a concurrency limit, for ``python -m benchmarks.limits``."""

from __future__ import annotations

import time
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("bench.atl")

limited = atlantis.Registry.from_atl("limited.atl")
"""``bench.NoopPerAccount`` (``concurrency 1 by account``) alone: its rows are all limited,
which the plain benchmarks must not pay."""

beside = atlantis.Registry.from_atl("bench.atl", "beside.atl")
"""``registry``'s jobs and a limited one on a queue of its own (``bench.NoopLimitedBeside``):
``python -m benchmarks.limits --beside``, plain jobs beside a limit that limits none of them."""


@registry.handler("bench.Noop")
def noop(ctx: atlantis.JobContext, args: Any) -> None:
    return None


@limited.handler("bench.NoopPerAccount")
def noop_per_account(ctx: atlantis.JobContext, args: Any) -> None:
    return None


beside.handler("bench.Noop")(noop)
beside.handler("bench.NoopLimitedBeside")(noop)


@registry.handler("bench.Sleep")
def sleep(ctx: atlantis.JobContext, args: Any) -> None:
    """Sleep ``args.seconds``, or until the supervisor drains (then return early)."""
    until = time.monotonic() + float(args.seconds)
    while time.monotonic() < until and not ctx.stopping:
        time.sleep(0.2)


beside.handler("bench.Sleep")(sleep)
