"""Handlers for tests/test_handler_steps.py (issue 34): each records what its step bodies
did in ``test_events`` (tests/apps/basic.py), so a test sees which bodies ran again.

- ``durable.Steps``: ``n`` plain steps ``s-0`` .. (each body records ``body-i`` and returns
  ``i * 2``); on its first attempt it holds after step ``hold_at`` (records ``held``, then
  waits) so that a test can kill or stop what runs it. Returns the sum of the values.
- ``durable.Pages``: ``pages`` transaction steps ``page-0`` .., each writing one row of
  ``durable_effects``; while its attempt is at most 3, the step ``hold_at + attempt - 1``
  holds inside its transaction after its write (records ``held-<page>``) for a kill.
- ``durable.Nap``: step ``before``, a durable sleep ``nap`` of ``seconds``, step ``after``.
- ``durable.Misuse``: ``twice`` (one name used twice), ``swallow`` (catches the sleep's
  Suspended and returns), ``nan`` (a step value of NaN), ``bad-sleep`` (a negative sleep),
  ``lose`` (a transaction step whose run loses the lease before its COMMIT).
- ``durable.AsyncSteps``: ``n`` awaited steps, async and sync bodies, a transaction and a
  durable sleep; its first attempt fails after them.
- ``durable.NapLimited``: a durable sleep in a job of ``concurrency 1``.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, cast

import psycopg

import atlantis
from tests.apps.basic import record, runs

registry = atlantis.Registry.from_atl("durable.atl")

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS durable_effects (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    page int NOT NULL,
    attempt int NOT NULL
)
"""


def _hold(ctx: atlantis.JobContext, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end and not ctx.cancelled:
        time.sleep(0.05)


@registry.handler("durable.Steps")
def steps(ctx: atlantis.JobContext, args: Any) -> int:
    def body(i: int) -> int:
        record(ctx, args.key, f"body-{i}")
        return i * 2

    total = 0
    for i in range(args.n):
        total += ctx.run_step(f"s-{i}", body, i)
        if i == args.hold_at and ctx.attempt == 1:
            record(ctx, args.key, "held")
            _hold(ctx)
    return total


@registry.handler("durable.Pages")
def pages(ctx: atlantis.JobContext, args: Any) -> int:
    def write(conn: psycopg.Connection[Any], page: int) -> int:
        conn.execute("INSERT INTO durable_effects (key, page, attempt) VALUES (%s, %s, %s)",
                     (args.key, page, ctx.attempt))
        if ctx.attempt <= 3 and page == args.hold_at + ctx.attempt - 1:
            record(ctx, args.key, f"held-{page}")
            _hold(ctx)
        return page

    done = 0
    for page in range(args.pages):
        done += 1 + 0 * ctx.transaction(f"page-{page}", write, page)
    return done


@registry.handler("durable.Nap")
def nap(ctx: atlantis.JobContext, args: Any) -> str:
    ctx.run_step("before", record, ctx, args.key, "before")
    ctx.sleep("nap", args.seconds)
    ctx.run_step("after", record, ctx, args.key, "after")
    return "woke"


@registry.handler("durable.Misuse")
def misuse(ctx: atlantis.JobContext, args: Any) -> Any:
    if args.mode == "twice":
        ctx.run_step("a", lambda: 1)
        ctx.run_step("a", lambda: 2)
    elif args.mode == "swallow":
        try:
            ctx.sleep("nap", 30)
        except BaseException:  # the misuse under test: a handler that swallows the sleep
            return "ignored"
    elif args.mode == "nan":
        ctx.run_step("ratio", lambda: {"ratio": math.nan})
    elif args.mode == "bad-sleep":
        ctx.sleep("nap", -1)
    elif args.mode == "set":  # a session setting made in a step (SET, not SET LOCAL)
        return ctx.transaction("set", lambda conn: conn.execute(
            "SELECT set_config('work_mem', '64kB', false)").fetchone()[0])
    elif args.mode == "show":
        return ctx.transaction("show", lambda conn: [conn.execute(
            "SELECT current_setting('work_mem')").fetchone()[0], conn.info.backend_pid])
    elif args.mode == "lose":
        def lose(conn: psycopg.Connection[Any]) -> str:
            conn.execute("INSERT INTO durable_effects (key, page, attempt) VALUES (%s, 0, %s)",
                         (args.key, ctx.attempt))
            assert ctx.database_url is not None
            with psycopg.connect(ctx.database_url, autocommit=True) as other:
                # Another claim took the job meanwhile (what a rescue and a new claim do).
                other.execute("UPDATE atlantis.jobs SET run_id = gen_random_uuid() "
                              "WHERE id = %s", (ctx.job_id,))
            record(ctx, args.key, "wrote")
            return "lost"
        ctx.transaction("write", lose)
        record(ctx, args.key, "after")
    return None


@registry.handler("durable.AsyncSteps")
async def async_steps(ctx: atlantis.AsyncJobContext, args: Any) -> int:
    async def body(i: int) -> int:
        await asyncio.sleep(0)
        record(ctx, args.key, f"body-{i}")
        return i

    total = 0
    for i in range(args.n):
        total += await ctx.run_step(f"a-{i}", body, i)
        total += await ctx.run_step(f"s-{i}", lambda i=i: i)

    async def write(conn: psycopg.AsyncConnection[Any]) -> int:
        await conn.execute("INSERT INTO durable_effects (key, page, attempt) VALUES (%s, 0, %s)",
                           (args.key, ctx.attempt))
        return 1

    total += int(await ctx.transaction("write", write))
    await ctx.sleep("nap", 0.1)  # suspends the first run: an awaited sleep
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after its steps")
    return total + runs(ctx, "never") * 0


@registry.handler("durable.NapLimited")
def nap_limited(ctx: atlantis.JobContext, args: Any) -> str:
    record(ctx, args.key, f"run-{ctx.attempt}")
    ctx.sleep("nap", args.seconds)
    record(ctx, args.key, "woke")
    return "woke"


@registry.handler("durable.FlowStep")
def flow_step(ctx: atlantis.JobContext, args: Any) -> str:
    ctx.run_step("a", record, ctx, args.key, "step-a")
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after its step")
    return "stepped"


@registry.handler("durable.FlowUndo")
def flow_undo(ctx: atlantis.JobContext, args: Any) -> str:
    ctx.run_step("u", record, ctx, args.key, "undo-u")
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after its step")
    return "undone"


@registry.handler("durable.FlowFail")
def flow_fail(ctx: atlantis.JobContext, args: Any) -> None:
    raise atlantis.Discard("the second step fails for good")


@registry.handler("durable.Wait")
def wait(ctx: atlantis.JobContext, args: Any) -> Any:
    ctx.run_step("before", record, ctx, args.key, "before")
    try:
        payload = ctx.wait_for_event("approval", args.event, timeout=args.timeout)
    except atlantis.EventTimeout:
        record(ctx, args.key, "timed-out")
        raise
    record(ctx, args.key, "received")
    return payload


@registry.handler("durable.FanOut")
def fan_out(ctx: atlantis.JobContext, args: Any) -> Any:
    ids = []
    if args.many:  # one statement for all of them
        ids = ctx.spawn_many("children", "durable.Child",
                             [{"key": args.key, "i": i, "fail": i == args.fail,
                               "hold_ms": args.hold_ms} for i in range(args.n)])
    for i in range(0 if args.many else args.n):
        ids.append(ctx.spawn(f"child-{i}", "durable.Child",
                             {"key": args.key, "i": i, "fail": i == args.fail,
                              "hold_ms": args.hold_ms}))
        if args.pause_ms:
            time.sleep(args.pause_ms / 1000)
    record(ctx, args.key, f"spawned-{len(ids)}")
    got = ctx.join("all", ids, results=args.results)
    record(ctx, args.key, "joined")
    return sum(got) if args.results else got


@registry.handler("durable.Child")
def child(ctx: atlantis.JobContext, args: Any) -> int:
    if args.fail:
        raise atlantis.Discard(f"child {args.i} fails for good")
    if args.hold_ms:
        end = time.monotonic() + args.hold_ms / 1000
        while time.monotonic() < end and not ctx.cancelled:
            time.sleep(0.02)
    return int(args.i) * 10


@registry.handler("durable.UniqueChild")
def unique_child(ctx: atlantis.JobContext, args: Any) -> str:
    return "unique"


@registry.handler("durable.SpawnMisuse")
def spawn_misuse(ctx: atlantis.JobContext, args: Any) -> Any:
    mode = args.mode
    if mode == "unknown-job":
        return ctx.spawn("c", "durable.NoSuchJob", {})
    if mode == "bad-args":
        return ctx.spawn("c", "durable.Child", {"key": args.key})  # no `i`
    if mode == "bad-ids":
        return ctx.join("j", cast(Any, ["12"]))
    if mode == "missing-id":
        return ctx.join("j", [987654321])
    if mode == "too-many":
        return ctx.join("j", [1] * 100_001)
    if mode == "unique":  # an existing job holds the key: its id, not a new child
        return ctx.spawn("u", "durable.UniqueChild", {"key": args.key})
    raise ValueError(mode)


@registry.handler("durable.AsyncFanOut")
async def async_fan_out(ctx: atlantis.AsyncJobContext, args: Any) -> Any:
    ids = [await ctx.spawn(f"c-{i}", "durable.Child", {"key": args.key, "i": i})
           for i in range(args.n)]
    return await ctx.join("all", ids)


@registry.handler("durable.WaitLimited")
def wait_limited(ctx: atlantis.JobContext, args: Any) -> Any:
    record(ctx, args.key, "run")
    return ctx.wait_for_event("go", "go")


@registry.handler("durable.FlowGate")
def flow_gate(ctx: atlantis.JobContext, args: Any) -> Any:
    ctx.wait_for_event("gate", "go")
    ids = [ctx.spawn(f"c-{i}", "durable.Child", {"key": args.key, "i": i + 1})
           for i in range(2)]
    return sum(ctx.join("all", ids))
