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


for _job in ("limited.PerKey", "limited.Global", "limited.Rated", "limited.Free"):
    registry.handler(_job)(_run)
