"""The app of ``python -m benchmarks.children`` (issue 35): ``children.atl``'s jobs on the
queue ``bench``.

- ``fan.Child``: returns ``3 * i + 1`` (:func:`value`), nothing else: the same tiny job
  whether a parent spawned it or ``atlantis.enqueue_many`` put it on the queue.
- ``fan.Parent``: ``n`` ``ctx.spawn`` calls (``c-0`` .., ``fan.Child`` with ``i``), then
  ``ctx.join`` of them all; returns how many results the join gave back, their sum, and
  whether each was its own child's (the order spawned).
- ``fan.SpawnOnly``: the same ``n`` spawns onto the queue ``queue`` (which nothing serves),
  no join: the spawn loop alone, no drain of its children beside it.
- ``fan.ParentBatch``: a prototype of a batch spawn from the public API: the same ``n``
  children enqueued :data:`BATCH` to a ``ctx.transaction`` step (``enqueue_many``, then
  their ``parent_id`` set, as ``atlantis.step_spawn`` sets it, so that the last one's end
  wakes the join), then the same join and result as ``fan.Parent``.
"""

from __future__ import annotations

from typing import Any

import psycopg

import atlantis

registry = atlantis.Registry.from_atl("children.atl")

BATCH = 1000
"""Children a ``fan.ParentBatch`` step enqueues: their ids (its record) stay under 64 KiB."""


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


def _spawn_batch(conn: psycopg.Connection[Any], parent: int, start: int, stop: int
                 ) -> list[int]:
    ids = atlantis.enqueue_many(conn, "fan.Child", [{"i": i} for i in range(start, stop)])
    conn.execute("UPDATE atlantis.jobs SET parent_id = %s WHERE id = ANY(%s)", (parent, ids))
    return ids


@registry.handler("fan.ParentBatch")
def parent_batch(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    ids: list[int] = []
    for start in range(0, args.n, BATCH):
        ids += ctx.transaction(f"c-{start}", _spawn_batch, ctx.job_id, start,
                               min(start + BATCH, args.n))
    return joined(ctx, ids)


@registry.handler("fan.SpawnOnly")
def spawn_only(ctx: atlantis.JobContext, args: Any) -> int:
    ids = [ctx.spawn(f"c-{i}", "fan.Child", {"i": i}, queue=args.queue)
           for i in range(args.n)]
    return len(ids)
