"""``run_inline``: one attempt of a handler in the test's process, with a real context.

The job is enqueued for real (its args validated exactly as :func:`atlantis.enqueue`
validates them: the same statement) on a queue of its own, claimed with the supervisor's
own claim (a run id, a lease, the fence its handler steps write under), run here, and its
end written with the supervisor's own finish (:mod:`atlantis.supervisor.policy` decides it).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import types
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg

from atlantis.context import AsyncJobContext, AttemptFlags, JobContext
from atlantis.errors import ConfigurationError, Discard, LeaseLost, Snooze, StepError, Suspended
from atlantis.protocol import results as result_rules
from atlantis.protocol.messages import Done
from atlantis.registry import Registration, Registry

#: The claim's worker name (``claimed_by``) of a run_inline attempt.
WORKER = "atlantis.testing"


@dataclass
class InlineRun:
    """What came of :func:`run_inline`: the job's id and the row's state after the attempt
    (``complete``, or ``available`` when it suspended, ``cancelled`` when cancelled), the
    handler's ``result`` as the job stores it (JSON, decoded), every checkpoint
    ``(pct, msg)`` in order, and for a suspended run ``suspended`` (True), ``wake`` and
    ``waits`` (``sleep:NAME``, ``event:EVENT``, ``join:NAME``)."""

    job_id: int
    state: str
    result: Any = None
    checkpoints: list[tuple[float, str]] = field(default_factory=list)
    suspended: bool = False
    wake: str | None = None
    waits: str | None = None
    steps_written: int = 0
    queue: str = ""


def registry_of(app: Registry | str) -> Registry:
    """``app`` as a Registry: itself, or the one ``package.module:attribute`` names."""
    if isinstance(app, Registry):
        return app
    from atlantis.app import load_app

    return load_app(app)


def _claim(conn: psycopg.Connection[Any], queue: str, job: str) -> Any:
    from atlantis.store.queries import Q

    row = conn.execute(Q.claim, {"queues": [queue], "jobs": [job], "worker": WORKER,
                                 "limit": 1, "limited": [], "within": 5.0}).fetchone()
    if row is None:
        raise RuntimeError(f"run_inline: job {job} on queue {queue} is not due: a suspended "
                           "run resumes after atlantis.testing.wake(conn, job_id)")
    return row


def _context(reg: Registration, row: Any, url: str, flags: AttemptFlags,
             workflow: dict[str, Any]) -> JobContext:
    from atlantis.protocol.fence import Fence
    from atlantis.steps import StepBook
    from atlantis.steps_async import AsyncStepBook

    job_id, job, _, _, _, attempt, max_attempts = row[:7]
    is_async = inspect.iscoroutinefunction(reg.handler)
    fence = Fence(job_id, str(row[15]), attempt)
    book = (AsyncStepBook if is_async else StepBook)(fence, url)
    return (AsyncJobContext if is_async else JobContext)(
        steps=book, job_id=job_id, job=job, queue=reg.decl.queue, attempt=attempt,
        max_attempts=max_attempts, deadline=row[11],
        logger=logging.getLogger(f"atlantis.job.{job}"), database_url=url, flags=flags,
        sink=lambda pct, msg: None, **workflow)


def _record_checkpoints(ctx: JobContext) -> list[tuple[float, str]]:
    seen: list[tuple[float, str]] = []
    send = ctx.checkpoint

    def checkpoint(pct: float, msg: str = "") -> Exception | None:
        seen.append((float(pct), str(msg)))
        return send(pct, msg)

    setattr(ctx, "checkpoint", checkpoint)  # noqa: B010 - this attempt's context only
    return seen


async def _await(aw: Any, ctx: JobContext) -> Any:
    try:
        return await aw
    finally:
        await ctx.steps.aclose()


def _call(reg: Registration, ctx: JobContext, args_text: str) -> tuple[Done, Any]:
    """Run the handler: the ``Done`` a child would send, and what the handler raised (or
    None)."""
    from atlantis.child.attempt import build_args
    from atlantis.child.text import child_error, describe

    job_id = ctx.job_id
    args = build_args(reg, args_text)
    try:
        ret = reg.handler(ctx, args)
        if inspect.isawaitable(ret):
            ret = asyncio.run(_await(ret, ctx))
    except Suspended as exc:
        return Done(job_id=job_id, outcome="suspend", wake=exc.wake, waits=exc.waits), exc
    except Discard as exc:
        return Done(job_id=job_id, outcome="discard", error=child_error(
            "discarded", exc.reason or "discarded by handler")), exc
    except Snooze as exc:
        return Done(job_id=job_id, outcome="snooze", delay=float(exc.seconds)), exc
    except (LeaseLost, Exception) as exc:
        return Done(job_id=job_id, outcome="failed", error=child_error(
            "exception", describe(exc), exc)), exc
    stop = ctx.steps.stop
    if stop is not None:  # the handler caught how its run ended and returned
        swallowed = StepError(f"the handler caught atlantis.{type(stop).__name__} ({stop}) "
                              "and went on; let it propagate")
        return Done(job_id=job_id, outcome="failed",
                    error=child_error("swallowed", swallowed)), swallowed
    text, why = result_rules.encode(ret)
    return Done(job_id=job_id, outcome="complete", result=text if why is None else None), None


def _finish(conn: psycopg.Connection[Any], row: Any, done: Done, cancelled: bool) -> str:
    """Write the attempt's end as the supervisor would; the row's state."""
    from atlantis.store.queries import Q
    from atlantis.store.supervision import Result, finish_params
    from atlantis.supervisor import policy

    facts = policy.AttemptFacts(attempt=row[5], max_attempts=row[6], backoff=row[10],
                                timeout=row[8])
    limits = policy.Limits(max_snooze=365 * 86400.0, max_backoff=86400.0)
    v = policy.decide(facts, limits, done, cancelled=cancelled)
    result = Result(row[0], row[5], v.state, v.spent, v.delay, v.error, None, label=v.label,
                    run=row[4], result=v.result, backoff=v.backoff, run_id=row[15],
                    wake=v.wake, waits=v.waits)
    conn.execute(Q.finish, finish_params(WORKER, [result], socket.gethostname(), os.getpid()))
    return v.state


def run_inline(app: Registry | str, job: str, args: Mapping[str, Any] | None = None, *,
               db: str, attempt: int = 1, cancelled: bool = False, stopping: bool = False,
               results: Mapping[str, Any] | None = None, workflow_id: int | None = None,
               step: str | None = None, resume: InlineRun | None = None) -> InlineRun:
    """Run one attempt of ``job`` with ``args`` in this process, with a real context.

    ``db`` is the test's database (``atlantis_db``). The args are validated as
    :func:`atlantis.enqueue` validates them (``atlantis.ValidationError``). ``attempt``
    sets ``ctx.attempt``; ``cancelled`` and ``stopping`` set the context's flags;
    ``results`` (with ``workflow_id`` and ``step``) is what a workflow's step reads of its
    dependencies in ``ctx.results``. Handler steps, sleeps, events, spawns and joins run
    for real. A handler that returns gives an :class:`InlineRun` with its result; one that
    raises raises the same exception here, after its row was ended as a supervisor would
    have ended it. A durable sleep, wait or join that suspends does not raise: the
    :class:`InlineRun` says ``suspended``; :func:`atlantis.testing.wake` then
    ``run_inline(..., resume=run)`` runs the job again, its steps recorded.
    """
    registry = registry_of(app)
    reg = registry.registrations.get(job)
    if reg is None:
        raise ConfigurationError(f"run_inline: the app registers no handler for job {job!r}")
    from atlantis.enqueue import enqueue
    from atlantis.store.queries import Q

    url = str(db)
    queue = resume.queue if resume is not None else f"atlantis-testing-{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        if resume is None:
            job_id = enqueue(conn, job, args or {}, queue=queue)
            if attempt != 1:
                conn.execute(Q.testing_prepare, {"id": job_id, "attempt": attempt})
        row = _claim(conn, queue, job)
        flags = AttemptFlags()
        flags.cancelled, flags.stopping = cancelled, stopping
        workflow: dict[str, Any] = {}
        if results is not None or workflow_id is not None or step is not None:
            workflow = {"workflow_id": workflow_id, "step": step,
                        "results": types.MappingProxyType(dict(results or {}))}
        ctx = _context(reg, row, url, flags, workflow)
        seen = _record_checkpoints(ctx)
        try:
            done, raised = _call(reg, ctx, row[3])
        finally:
            _close_book(ctx)
        state = _finish(conn, row, done, cancelled)
    run = InlineRun(job_id=row[0], state=state, checkpoints=seen, queue=queue,
                    steps_written=ctx.steps.written)
    if done.outcome == "suspend":
        run.suspended, run.wake, run.waits = True, done.wake, done.waits
        return run
    if raised is not None:
        raise raised
    run.result = None if done.result is None else orjson.loads(done.result)
    return run


def _close_book(ctx: JobContext) -> None:
    conn = getattr(ctx.steps, "_conn", None)
    if conn is not None and not isinstance(conn, psycopg.AsyncConnection):
        conn.close()
    ctx.steps._conn = None
