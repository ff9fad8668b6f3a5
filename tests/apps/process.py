"""Handlers that exercise the supervisor: kill trees, memory, leftovers, output."""

from __future__ import annotations

import os
from typing import Any

import atlantis
from tests.apps.basic import record

registry = atlantis.Registry.from_atl("process.atl")


@registry.handler("proc.Noop")
def noop(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"pid={os.getpid()}")
