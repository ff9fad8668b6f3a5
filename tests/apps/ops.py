"""Handlers for tests/test_long_jobs.py. ``ops.Long`` does what its ``mode`` says:

- ``obey``: loops until ``ctx.cancelled``, records ``saw-cancel``, returns.
- ``ignore``: records ``saw-cancel`` once it sees ``ctx.cancelled`` and keeps going; SIGTERM
  (the end of the cancel grace) is recorded as ``terminated``.
- ``raise``: raises once it sees ``ctx.cancelled``.
- ``yield``: loops until ``ctx.stopping`` (a drain), records ``saw-stopping``, raises
  ``Snooze(0)``.
- ``wait``: loops until ``ctx.cancelled`` or ``ctx.stopping``, records which, returns.
- ``progress``: checkpoints 10, 20, ... every 0.3 s for 3 s, then returns.
- ``flaky``: fails its first attempt, completes its second.

``ops.Runs`` prints which call of the job it is and fails the first two (tests/test_runs.py).

``ops.Brief`` runs the same handler with a 3 s heartbeat (renewed every second).
"""

from __future__ import annotations

import time
from typing import Any

import atlantis
from tests.apps.basic import record, runs

registry = atlantis.Registry.from_atl("ops.atl")


def _until(predicate: Any, limit: float = 50.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@registry.handler("ops.Long")
def long(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "started")
    mode = args.mode
    if mode == "progress":
        for i in range(1, 11):
            ctx.checkpoint(i * 10, f"step {i}")
            time.sleep(0.3)
        return
    if mode == "flaky":
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return
    if mode == "yield":
        _until(lambda: ctx.stopping)
        record(ctx, args.key, "saw-stopping")
        raise atlantis.Snooze(0)
    if mode == "wait":
        _until(lambda: ctx.cancelled or ctx.stopping)
        record(ctx, args.key, f"cancelled={ctx.cancelled} stopping={ctx.stopping}")
        return
    _until(lambda: ctx.cancelled)
    record(ctx, args.key, "saw-cancel")
    if mode == "raise":
        raise RuntimeError("gave up on cancel")
    if mode == "ignore":
        try:
            time.sleep(50)
        except BaseException:
            record(ctx, args.key, "terminated")
            raise


registry.handler("ops.Brief")(long)  # ops.Long with a 3 s heartbeat: renewed every second


@registry.handler("ops.Talk")
def talk(ctx: atlantis.JobContext, args: Any) -> None:
    for i in range(args.lines):
        print(f"talk {i:05d} " + "y" * 40, flush=True)
        if i % 20 == 0:
            time.sleep(0.01)


@registry.handler("ops.AsyncLong")
async def async_long(ctx: atlantis.JobContext, args: Any) -> None:
    """Waits (asynchronously) for ``ctx.cancelled``, records ``saw-cancel``, returns."""
    import asyncio

    record(ctx, args.key, "started")
    for _ in range(2500):
        if ctx.cancelled:
            record(ctx, args.key, "saw-cancel")
            return
        await asyncio.sleep(0.02)


@registry.handler("ops.Runs")
def runs_apart(ctx: atlantis.JobContext, args: Any) -> None:
    """Prints which call of the job this is (1, 2, ...: across retries), and fails the first
    two: its first run (2 attempts) ends dead, a retry's first attempt completes."""
    record(ctx, args.key, "ran")
    call = runs(ctx, args.key)
    print(f"call {call} attempt {ctx.attempt}", flush=True)
    if call <= 2:
        raise RuntimeError(f"call {call} fails")
