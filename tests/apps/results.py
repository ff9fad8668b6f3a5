"""Handlers whose return values become their jobs' results (tests/test_results.py).

``results.Return {key, mode}`` returns what ``mode`` says:

- ``dict``: ``{"key": key, "n": 1, "nested": {"list": [1, 2.5, "x", None]}, "ok": True}``;
- ``none``: None (no result); ``async``: a coroutine whose value is ``["async", key]``;
- ``object``: an ``object()`` (not JSON); ``huge``: a string of 70,000 characters (over
  64 KiB of JSON); ``nul``: ``{"a": "b\\x00c"}`` (jsonb cannot hold NUL);
  ``bigint``: ``2**70`` (orjson writes no integer past 64 bits); ``nonfinite``:
  ``{"ratio": nan, "max": inf}`` (JSON cannot carry either: orjson writes null);
- ``context``: what the handler sees of its step: ``workflow_id``, ``step``,
  ``idempotency_key``, ``results`` and ``compensating`` (``[step, error]`` or None);
  ``undo``: the same, but the step named ``fail`` raises ``Discard("fails on purpose")``;
- ``forge-*``: writes a forged ``Done`` of outcome ``complete`` straight onto the events pipe,
  whose ``result`` is ``{not json`` (``forge-invalid``), ``{"a": "\\u0000"}``
  (``forge-nul``) or a JSON string over 64 KiB (``forge-huge``), then exits at once (the
  supervisor reads the frame before it sees the exit).

Each run prints ``ran <key> <mode>`` first. The workflows of ``results.atl`` run it as
their steps: ``results.Chain`` (``make``, then ``see``), ``results.One`` (``only``) and
``results.Undo`` (``make``, undone by a compensation when ``fail`` fails).
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any

import orjson

import atlantis

registry = atlantis.Registry.from_atl("results.atl")

FORGED = {
    "forge-invalid": "{not json",
    "forge-nul": '{"a": "\\u0000"}',
    "forge-huge": orjson.dumps("x" * 70_000).decode(),
}


async def _later(key: str) -> list[str]:
    return ["async", key]


def _forge(ctx: atlantis.JobContext, result: str) -> None:
    fd = int(sys.argv[sys.argv.index("--events-fd") + 1])
    body = orjson.dumps({"t": "done", "job_id": ctx.job_id, "outcome": "complete",
                         "result": result})
    os.write(fd, struct.pack(">I", len(body)) + body)
    os._exit(0)


@registry.handler("results.Return")
def give_back(ctx: atlantis.JobContext, args: Any) -> Any:
    print(f"ran {args.key} {args.mode}", flush=True)
    mode = args.mode
    if mode == "dict":
        return {"key": args.key, "n": 1, "nested": {"list": [1, 2.5, "x", None]}, "ok": True}
    if mode == "none":
        return None
    if mode == "async":
        return _later(args.key)
    if mode == "object":
        return object()
    if mode == "huge":
        return "x" * 70_000
    if mode == "nul":
        return {"a": "b\x00c"}
    if mode == "bigint":
        return 2**70
    if mode == "nonfinite":
        return {"ratio": float("nan"), "max": float("inf")}
    if mode == "undo" and ctx.step == "fail":
        raise atlantis.Discard("fails on purpose")
    if mode in ("context", "undo"):
        comp = ctx.compensating
        return {"workflow_id": ctx.workflow_id, "step": ctx.step,
                "idempotency_key": ctx.idempotency_key, "results": dict(ctx.results),
                "compensating": None if comp is None else [comp.step, comp.error]}
    if mode in FORGED:
        _forge(ctx, FORGED[mode])
    raise ValueError(f"unknown mode {mode!r}")
