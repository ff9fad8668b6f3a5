"""Handlers for the console's tests (tests/test_console_api.py, test_console_browser.py).

- ``console.Import``: a long import. Every 0.25 s it checkpoints one more percent (up to
  ``steps`` steps, scaled to 0..100) with ``message`` and the step, and prints a log line;
  it returns as soon as ``ctx.cancelled`` turns true (the job then ends ``cancelled``).
- ``console.Fail``: raises ``RuntimeError(message)``: straight to the dead-letter queue.
- ``console.Quick``: returns at once, its account and step (None outside a workflow) as
  its result.
"""

from __future__ import annotations

import time
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("console_app.atl")


@registry.handler("console.Import")
def import_(ctx: atlantis.JobContext, args: Any) -> None:
    steps = max(int(args.steps), 1)
    for step in range(1, steps + 1):
        if ctx.cancelled:
            print(f"account {args.account_id}: cancelled at step {step}", flush=True)
            return
        pct = min(100, step * 100 // steps)
        ctx.checkpoint(pct, f"{args.message} {step}/{steps}")
        print(f"account {args.account_id}: imported page {step}", flush=True)
        time.sleep(0.25)


@registry.handler("console.Fail")
def fail(ctx: atlantis.JobContext, args: Any) -> None:
    raise RuntimeError(args.message)


@registry.handler("console.Quick")
def quick(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    return {"account": args.account_id, "step": ctx.step}
