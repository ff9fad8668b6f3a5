"""Handlers of tests/apps/limited.atl: each records when it started and ended (PostgreSQL's
clock, in ``test_events``) and holds for ``hold`` seconds between."""

from __future__ import annotations

import time
from typing import Any

import atlantis
from tests.apps.basic import record

registry = atlantis.Registry.from_atl("limited.atl")


def _run(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "started")
    time.sleep(args.hold)
    record(ctx, args.key, "ended")


for _job in ("limited.PerKey", "limited.Global", "limited.Rated", "limited.Free", "limited.Both",
             "limited.Fair"):
    registry.handler(_job)(_run)


@registry.handler("limited.Lease")
def lease(ctx: atlantis.JobContext, args: Any) -> None:
    """As the others, with a `beat` event about every 0.1 s while it holds: what the attempt
    did last, should it die on the way (its supervisor killed)."""
    record(ctx, args.key, "started")
    end = time.monotonic() + (args.hold if ctx.attempt == 1 else args.retry_hold)
    while time.monotonic() < end:
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        record(ctx, args.key, "beat")
    record(ctx, args.key, "ended")
