"""The release after of the ``pruned`` namespace (tests/test_sync_prune.py): Keep alone."""

from __future__ import annotations

from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("prune_new.atl")


@registry.handler("pruned.Keep")
def keep(ctx: atlantis.JobContext, args: Any) -> None:
    pass
