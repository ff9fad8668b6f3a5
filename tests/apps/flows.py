"""Handlers of tests/apps/flows.atl: workflow steps that record what they did in
``test_events`` under their idempotency key (see tests/apps/basic.py's ``record``)."""

from __future__ import annotations

import time
from typing import Any

import atlantis
from tests.apps.basic import connect, record

registry = atlantis.Registry.from_atl("flows.atl")


def _released(ctx: atlantis.JobContext, key: str) -> bool:
    with connect(ctx) as conn:
        row = conn.execute("SELECT count(*) FROM test_events WHERE key = %s", (key,)).fetchone()
    return bool(row and row[0])


def _started(ctx: atlantis.JobContext, steps: list[str]) -> int:
    keys = [f"{ctx.workflow_id}:{s}" for s in steps]
    with connect(ctx) as conn:
        row = conn.execute("SELECT count(DISTINCT key) FROM test_events"
                           " WHERE key = ANY(%s) AND event = 'started'", (keys,)).fetchone()
    return int(row[0]) if row else 0


@registry.handler("flows.Step")
def step(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    record(ctx, ctx.idempotency_key, "started")
    if args.hold == ctx.step:
        while not _released(ctx, f"release:{ctx.workflow_id}"):
            if ctx.cancelled:
                record(ctx, ctx.idempotency_key, "saw-cancel")
                return {"step": ctx.step, "cancelled": True}
            time.sleep(0.05)
    if args.meet and ctx.step in args.meet:
        while _started(ctx, list(args.meet)) < len(args.meet):
            time.sleep(0.02)
    if args.fail == ctx.step:
        raise atlantis.Discard(f"step {ctx.step} fails on purpose")
    record(ctx, ctx.idempotency_key, "finished")
    return {"step": ctx.step, "saw": sorted(ctx.results), "key": ctx.idempotency_key}


@registry.handler("flows.Undo")
def undo(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    assert ctx.compensating is not None
    record(ctx, ctx.idempotency_key, "undoing")
    if args.undo_fails == ctx.step and not _released(ctx, f"fix:{ctx.workflow_id}"):
        raise atlantis.Discard(f"the undo of {ctx.step} fails on purpose")
    record(ctx, ctx.idempotency_key, f"undone after {ctx.compensating.step}")
    assert ctx.step is not None
    return {"undone": ctx.step, "had": ctx.results.get(ctx.step)}
