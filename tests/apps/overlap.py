"""Handlers for the tests of schedules for long jobs (tests/test_schedule_overlap.py).

Each job records ``started`` and ``finished`` under its ``key`` in ``test_events`` (with the
database's clock) around a sleep of ``seconds``.
"""

from __future__ import annotations

import time
from typing import Any

import atlantis
from tests.apps.basic import record

registry = atlantis.Registry.from_atl("overlap.atl")


@registry.handler("overlap.Long")
@registry.handler("overlap.LongAllow")
@registry.handler("overlap.Quick")
def run(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "started")
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    record(ctx, args.key, "finished")
