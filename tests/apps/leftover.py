"""``leftover.Fork``: starts a process that outlives it, and returns: the supervisor ends the
process and records a warning on the attempt (tests/test_mistakes.py)."""

from __future__ import annotations

import subprocess
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("leftover.atl")


@registry.handler("leftover.Fork")
def fork(ctx: atlantis.JobContext, args: Any) -> None:
    subprocess.Popen(["sleep", "300"])
