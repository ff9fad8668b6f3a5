"""The release before of the ``pruned`` namespace (tests/test_sync_prune.py): ``pruned.Busy``
waits until the file its ``gate`` names exists; the others do nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("prune_old.atl")


@registry.handler("pruned.Busy")
def busy(ctx: atlantis.JobContext, args: Any) -> None:
    deadline = time.monotonic() + 50
    while not Path(args.gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


for _name in ("pruned.Keep", "pruned.Gone", "pruned.Used"):
    registry.handler(_name)(lambda ctx, args: None)
