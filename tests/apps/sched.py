"""Handlers for the schedule tests (tests/test_schedules.py).

``sched.Tick`` (every two seconds) records ``ran`` under its ``key`` (default ``tick``) in
``test_events``; ``sched.Nightly`` does nothing.
"""

from __future__ import annotations

from typing import Any

import atlantis
from tests.apps.basic import record

registry = atlantis.Registry.from_atl("sched.atl")


@registry.handler("sched.Tick")
def tick(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "ran")


@registry.handler("sched.Nightly")
def nightly(ctx: atlantis.JobContext, args: Any) -> None:
    pass
