"""Handlers for the per-second schedule tests (tests/test_schedules.py).

``persec.Second`` (every second) does nothing: the tests read ``atlantis.schedule_runs``.
"""

from __future__ import annotations

from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("sched_second.atl")


@registry.handler("persec.Second")
def second(ctx: atlantis.JobContext, args: Any) -> None:
    pass
