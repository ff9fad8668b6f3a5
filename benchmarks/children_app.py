"""The app of ``python -m benchmarks.children`` (issue 35): ``children.atl``'s jobs on the
queue ``bench``.

- ``fan.Child``: returns ``3 * i + 1`` (:func:`value`), nothing else: the same tiny job
  whether a parent spawned it or ``atlantis.enqueue_many`` put it on the queue.
- ``fan.Parent``: ``n`` ``ctx.spawn`` calls (``c-0`` .., ``fan.Child`` with ``i``), then
  ``ctx.join`` of them all; returns how many results the join gave back, their sum, and
  whether each was its own child's (the order spawned).
- ``fan.SpawnOnly``: the same ``n`` spawns onto the queue ``queue`` (which nothing serves),
  no join: the spawn loop alone, no drain of its children beside it.
- ``fan.ParentMany``: the same ``n`` children by ``ctx.spawn_many`` (one call of up to
  :data:`MANY`, one fenced statement and one step each), then the same join and result as
  ``fan.Parent``.
"""

from __future__ import annotations

from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("children.atl")

MANY = 10_000
"""Children one ``ctx.spawn_many`` of ``fan.ParentMany`` enqueues (the product's cap)."""


def value(i: int) -> int:
    """What child ``i`` returns."""
    return 3 * i + 1


@registry.handler("fan.Child")
def child(ctx: atlantis.JobContext, args: Any) -> int:
    return value(int(args.i))


def joined(ctx: atlantis.JobContext, ids: list[int]) -> dict[str, Any]:
    got = ctx.join("all", ids)
    return {"n": len(got), "sum": sum(got),
            "in_order": got == [value(i) for i in range(len(ids))]}


@registry.handler("fan.Parent")
def parent(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    return joined(ctx, [ctx.spawn(f"c-{i}", "fan.Child", {"i": i}) for i in range(args.n)])


@registry.handler("fan.ParentMany")
def parent_many(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    ids: list[int] = []
    for start in range(0, args.n, MANY):
        ids += ctx.spawn_many(f"c-{start}", "fan.Child",
                              [{"i": i} for i in range(start, min(start + MANY, args.n))])
    return joined(ctx, ids)


@registry.handler("fan.SpawnOnly")
def spawn_only(ctx: atlantis.JobContext, args: Any) -> int:
    ids = [ctx.spawn(f"c-{i}", "fan.Child", {"i": i}, queue=args.queue)
           for i in range(args.n)]
    return len(ids)
