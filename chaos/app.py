"""The chaos run's workload: idempotent handlers that record every execution.

Each execution of a handler (one run of one attempt, named by a random ``run`` token)
writes its history on the handler's own, direct connection (``--handler-database-url``,
never through the driver's proxies), each row stamped by PostgreSQL's clock: ``start``,
a ``tick`` per step of work, the ``effect`` and ``end`` (or ``fail``, ``cancelled``). The
effect is a row of ``chaos_effects`` written only if none has the job's idempotency key yet
(``ctx.idempotency_key``: the job's id, or ``wid:step`` for a workflow's step and
``wid:step:compensate`` for its compensation): an idempotent handler, whose "exactly once"
holds only if no two executions of one job overlap.

The workflow ``chaos.Order`` (jobs.atl) runs its steps and compensations here too; each
checks what atlantis handed it (its key, its predecessors' results, ``ctx.compensating``)
and records ``bad-context`` when something is wrong.

``chaos.Limited`` (``concurrency 2 by account``, ``concurrency 3``) is the same handler; it
is declared in :data:`registry`, which the supervisors of the first two slots serve, and
left out of :data:`unlimited`, which the others serve (chaos/cluster.py).

``chaos.Durable`` (issue 34) runs handler steps: each plain step's body records
``body:<step>`` in the history before it returns, each transaction step writes one row of
``chaos_step_effects`` in its transaction, and a durable sleep ends a run (``suspend``); its
executions are named by the claim's run id, which ``atlantis.job_steps`` records too
(chaos/durable.py checks them).

``chaos.Waiter`` and ``chaos.Fan`` (issue 35) record what their waits received and their
spawns returned, named by the claim's run id too (chaos/waits.py checks them).

While PostgreSQL restarts, a write is retried until it goes through: the handler blocks
meanwhile, as a real one would, and its lease watchdog decides whether it may go on.
"""

from __future__ import annotations

import decimal
import os
import secrets
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg

import atlantis

registry = atlantis.Registry.from_atl("jobs.atl")
LIMITED = "chaos.Limited"

SCHEMA = """
CREATE TABLE IF NOT EXISTS chaos_history (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    run text NOT NULL,
    pid int NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS chaos_effects (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    key text NOT NULL,
    run text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS chaos_effects_key ON chaos_effects (key);
CREATE TABLE IF NOT EXISTS chaos_step_effects (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    step text NOT NULL,
    run text NOT NULL,
    attempt int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

_EVENT = ("INSERT INTO chaos_history (job_id, attempt, run, pid, event) "
          "VALUES (%(job)s, %(attempt)s, %(run)s, %(pid)s, %(event)s)")
# Idempotent: the effect is written only if none has the key yet. No unique constraint backs
# it: two executions of one job running at once could both write it, which the check would see.
_EFFECT = """
WITH ins AS (
    INSERT INTO chaos_effects (job_id, key, run)
    SELECT %(job)s, %(key)s, %(run)s
     WHERE NOT EXISTS (SELECT 1 FROM chaos_effects WHERE key = %(key)s)
    RETURNING 1
)
INSERT INTO chaos_history (job_id, attempt, run, pid, event)
SELECT %(job)s, %(attempt)s, %(run)s, %(pid)s,
       CASE WHEN EXISTS (SELECT 1 FROM ins) THEN 'effect' ELSE 'effect-found' END
"""
RETRY_EVERY = 0.1

_conn: psycopg.Connection[Any] | None = None


def _write(url: str, query: Any, params: dict[str, Any]) -> None:
    """Run one autocommit statement on this process's connection, retrying through outages."""
    global _conn
    while True:
        try:
            if _conn is None or _conn.closed:
                _conn = psycopg.connect(url, autocommit=True, connect_timeout=5,
                                        application_name="chaos-handler")
            _conn.execute(query, params)
            return
        except psycopg.OperationalError:
            if _conn is not None:
                _conn.close()
            _conn = None
            time.sleep(RETRY_EVERY)


class Execution:
    """One run of one attempt of a job, as the history records it."""

    def __init__(self, ctx: atlantis.JobContext, run: str | None = None) -> None:
        assert ctx.database_url is not None
        self.url = ctx.database_url
        self.params: dict[str, Any] = {"job": ctx.job_id, "attempt": ctx.attempt,
                                       "run": run or secrets.token_hex(8), "pid": os.getpid()}
        self.key = ctx.idempotency_key

    def record(self, event: str) -> None:
        _write(self.url, _EVENT, {**self.params, "event": event})

    def effect(self) -> None:
        _write(self.url, _EFFECT, {**self.params, "key": self.key})


def _work(ctx: atlantis.JobContext, ticks: int, tick_ms: int, fail: bool,
          context_ok: bool = True) -> None:
    execution = Execution(ctx)
    execution.record("start")
    if not context_ok:
        execution.record("bad-context")
    for i in range(ticks):
        if ctx.cancelled:
            execution.record("cancelled")
            return  # the job ends cancelled
        time.sleep(tick_ms / 1000)
        ctx.checkpoint(100 * (i + 1) / ticks, f"tick {i + 1}/{ticks}")
        execution.record("tick")
    if fail:
        execution.record("fail")
        raise RuntimeError(f"job {ctx.job_id} fails in attempt {ctx.attempt}, as planned")
    execution.effect()
    execution.record("end")


@registry.handler("chaos.Work")
def work(ctx: atlantis.JobContext, args: Any) -> None:
    """``fail``: ``never``, or ``first`` (the first attempt fails, the next ones succeed)."""
    _work(ctx, args.ticks, args.tick_ms, fail=args.fail == "first" and ctx.attempt == 1)


def _crunch(execution: Execution, calls: int, digits: int) -> None:
    for _ in range(calls):
        execution.record("c-before")
        decimal.Context(prec=digits).ln(decimal.Decimal(3))  # one C call holding the GIL
        execution.record("c-after")


#: The grandchild: leaves its parent's session and is re-parented (a double fork), then
#: crunches as its handler does, recording under the handler's execution; it holds the
#: write end of a pipe its handler reads to EOF.
_GRANDCHILD = """
import os, sys
os.setsid()
if os.fork():
    os._exit(0)
from chaos.app import grandchild
grandchild(*sys.argv[1:])
"""


def grandchild(url: str, job: str, attempt: str, run: str, calls: str, digits: str) -> None:
    execution = Execution.__new__(Execution)
    execution.url = url
    execution.params = {"job": int(job), "attempt": int(attempt), "run": run, "pid": os.getpid()}
    _crunch(execution, int(calls), int(digits))


@registry.handler("chaos.Crunch")
def crunch(ctx: atlantis.JobContext, args: Any) -> None:
    """C calls that hold the GIL, here and in a grandchild (see jobs.atl)."""
    execution = Execution(ctx)
    execution.record("start")
    waiting = None
    if args.grandchild:
        r, w = os.pipe()
        p = execution.params
        subprocess.run([sys.executable, "-c", _GRANDCHILD, execution.url, str(p["job"]),
                        str(p["attempt"]), p["run"], str(args.calls), str(args.digits)],
                       pass_fds=(w,), check=True)
        os.close(w)
        waiting = os.fdopen(r, "rb")
    _crunch(execution, args.calls, args.digits)
    if waiting is not None:
        with waiting:
            waiting.read()  # EOF: the grandchild is done
    execution.effect()
    execution.record("end")


@registry.handler(LIMITED)
def limited(ctx: atlantis.JobContext, args: Any) -> None:
    """Held by its limits; ``fail``: ``never`` or ``first``, as for ``chaos.Work``."""
    _work(ctx, args.ticks, args.tick_ms, fail=args.fail == "first" and ctx.attempt == 1)


@registry.handler("chaos.Doomed")
def doomed(ctx: atlantis.JobContext, args: Any) -> None:
    """Fails every attempt: the job must end ``dead`` after exactly its retries."""
    _work(ctx, args.ticks, args.tick_ms, fail=True)


DURABLE = "chaos.Durable"
# One effect row per transaction step, written in the step's transaction (on its ``conn``).
# No unique constraint: a transaction step committed twice would leave two rows.
_STEP_EFFECT = ("INSERT INTO chaos_step_effects (job_id, step, run, attempt) "
                "VALUES (%(job)s, %(step)s, %(run)s, %(attempt)s)")


def run_id(ctx: atlantis.JobContext) -> str | None:
    """The run id of this claim, which the step records carry (None outside a run)."""
    fence = getattr(ctx.steps, "fence", None)
    return None if fence is None else str(uuid.UUID(str(fence.run_id)))


@registry.handler(DURABLE)
def durable(ctx: atlantis.JobContext, args: Any) -> None:
    """``rounds`` rounds of a plain step ``step-<r>`` (its body records ``body:step-<r>``,
    then works ``tick_ms``) and a transaction step ``pay-<r>`` (its row of
    ``chaos_step_effects``, then ``tick_ms`` more inside the transaction); after round
    ``nap_after`` a durable sleep ``nap`` of ``nap_ms`` (``woke`` once past it). A value
    other than the one its body returned is recorded as ``bad-value``."""
    execution = Execution(ctx, run=run_id(ctx))
    execution.record("start")

    def body(name: str) -> dict[str, str]:
        execution.record(f"body:{name}")  # durable before the step's record is written
        time.sleep(args.tick_ms / 1000)
        return {"ran": name}

    def pay(conn: psycopg.Connection[Any], name: str) -> dict[str, str]:
        conn.execute(_STEP_EFFECT, {**execution.params, "step": name})
        time.sleep(args.tick_ms / 1000)
        return {"paid": name}

    try:
        for r in range(args.rounds):
            if ctx.cancelled:
                execution.record("cancelled")
                return
            values = (ctx.run_step(f"step-{r}", body, f"step-{r}"),
                      ctx.transaction(f"pay-{r}", pay, f"pay-{r}"))
            if values != ({"ran": f"step-{r}"}, {"paid": f"pay-{r}"}):
                execution.record("bad-value")
            if r == 0 and args.fail == "first" and ctx.attempt == 1:
                execution.record("fail")
                raise RuntimeError(f"job {ctx.job_id} fails after its first round, as planned")
            if r == args.nap_after:
                ctx.sleep("nap", args.nap_ms / 1000)
                execution.record("woke")
    except atlantis.Suspended:
        execution.record("suspend")
        raise
    execution.effect()
    execution.record("end")


WAITER, FAN, LEAF = "chaos.Waiter", "chaos.Fan", "chaos.Leaf"
WAITS = ("first", "second")
"""The events a waiter waits for, in this order, each under the step ``on-<event>``."""


@registry.handler(WAITER)
def waiter(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    """Works ``tick_ms``, then waits for each event of WAITS in turn; returns the nonce of
    each payload received. ``fail "first"``: the first attempt fails after "first"."""
    execution = Execution(ctx, run=run_id(ctx))
    execution.record("start")
    got: dict[str, Any] = {}
    try:
        time.sleep(args.tick_ms / 1000)
        for event in WAITS:
            execution.record(f"wait:on-{event}")
            payload = ctx.wait_for_event(f"on-{event}", event)
            got[event] = payload.get("nonce") if isinstance(payload, dict) else payload
            execution.record(f"got:on-{event}:{got[event]}")
            if event == WAITS[0] and args.fail == "first" and ctx.attempt == 1:
                execution.record("fail")
                raise RuntimeError(f"job {ctx.job_id} fails after its first event, as planned")
    except atlantis.Suspended:
        execution.record("suspend")
        raise
    execution.effect()
    execution.record("end")
    return got


@registry.handler(FAN)
def fan(ctx: atlantis.JobContext, args: Any) -> dict[str, Any]:
    """Spawns ``n`` leaves ``leaf-<i>``, ``tick_ms`` apart, then joins them (``all``);
    ``fail "first"``: the first attempt fails halfway through its spawns."""
    execution = Execution(ctx, run=run_id(ctx))
    execution.record("start")
    try:
        ids: list[int] = []
        for i in range(args.n):
            leaf_args = {"i": i, "tick_ms": args.leaf_ms,
                         "fail": "first" if i == args.fail_leaf else "never"}
            ids.append(ctx.spawn(f"leaf-{i}", LEAF, leaf_args))
            execution.record(f"spawned:leaf-{i}:{ids[-1]}")
            time.sleep(args.tick_ms / 1000)
            if i == args.n // 2 and args.fail == "first" and ctx.attempt == 1:
                execution.record("fail")
                raise RuntimeError(f"job {ctx.job_id} fails amid its spawns, as planned")
        values = ctx.join("all", ids)
    except atlantis.Suspended:
        execution.record("suspend")
        raise
    except atlantis.ChildFailed:  # a leaf was cancelled: every attempt fails the same way
        execution.record("fail")
        raise
    execution.effect()
    execution.record("end")
    return {"values": values, "sum": sum(values)}


@registry.handler(LEAF)
def leaf(ctx: atlantis.JobContext, args: Any) -> int:
    """A short job (``fail "first"``: its first attempt fails); its value is its job id."""
    _work(ctx, 1, args.tick_ms, fail=args.fail == "first" and ctx.attempt == 1)
    return ctx.job_id


PREDECESSORS: dict[str, frozenset[str]] = {
    "reserve": frozenset(), "charge": frozenset({"reserve"}),
    "notify": frozenset({"reserve"}), "ship": frozenset({"reserve", "charge", "notify"}),
}
"""The transitive predecessors of each step of ``chaos.Order``, whose results it sees."""


def _result(workflow_id: int, step: str) -> dict[str, str]:
    """What each step returns: the key it recorded its effect under."""
    return {"key": f"{workflow_id}:{step}"}


def context_ok(ctx: atlantis.JobContext) -> bool:
    """Whether atlantis handed this step (or compensation) of ``chaos.Order`` what it
    promised: its idempotency key, the results of every step before it, and, in a
    compensation, the undone step's result (None if it never completed) and
    ``ctx.compensating``."""
    wid, step = ctx.workflow_id, ctx.step
    if wid is None or step not in PREDECESSORS:
        return False
    before = PREDECESSORS[step]
    results = dict(ctx.results)
    seen = {p: results.pop(p, None) for p in before}
    if seen != {p: _result(wid, p) for p in before}:
        return False
    if ctx.compensating is None:
        return not results and ctx.idempotency_key == f"{wid}:{step}"
    return (set(results) == {step} and results[step] in (None, _result(wid, step))
            and ctx.compensating.step in (None, *PREDECESSORS)
            and ctx.idempotency_key == f"{wid}:{step}:compensate")


@registry.handler("chaos.Step")
def step(ctx: atlantis.JobContext, args: Any) -> dict[str, str] | None:
    """A step of ``chaos.Order``: fails every attempt when ``doom`` names it; ``doom
    "slow"``: notify outlasts the workflow's timeout (it is cancelled mid-run)."""
    ticks, tick_ms = args.ticks, args.tick_ms
    if args.doom == "slow" and ctx.step == "notify":
        ticks, tick_ms = 50, 800  # 40 s: past the workflow's 30 s timeout
    _work(ctx, ticks, tick_ms, fail=args.doom == ctx.step, context_ok=context_ok(ctx))
    return None if ctx.workflow_id is None or ctx.step is None else _result(ctx.workflow_id,
                                                                            ctx.step)


@registry.handler("chaos.Undo")
def undo(ctx: atlantis.JobContext, args: Any) -> None:
    """A compensation of ``chaos.Order``: tolerates a step that did nothing (it records its
    own effect under its own key either way); ``fail "first"``: its first attempt fails."""
    _work(ctx, args.ticks, args.tick_ms, fail=args.fail == "first" and ctx.attempt == 1,
          context_ok=context_ok(ctx))


unlimited = atlantis.Registry([d for name, d in registry.decls.items() if name != LIMITED],
                              registry.workflows.values())
"""The same app without ``chaos.Limited``: what a supervisor that claims ahead serves."""
for _name, _registration in registry.registrations.items():
    if _name != LIMITED:
        unlimited.register(_name, _registration.handler)
