"""The benchmark's app: a no-op handler, so the numbers measure atlantis itself."""

from __future__ import annotations

from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("bench.atl")


@registry.handler("bench.Noop")
def noop(ctx: atlantis.JobContext, args: Any) -> None:
    return None
