"""One attempt: decode its args, run its handler, and turn whatever happened into a ``Done``.

Nothing a handler raises or does escapes :func:`run_attempt`: every outcome, however
hostile the exception, becomes a valid message (see :mod:`atlantis.child.text`), with
one of the error kinds of :data:`atlantis.protocol.messages.ErrorKind`:

- ``args``: the args text could not be decoded against the declaration, or the args object
  could not be built from it (the handler does not run);
- ``discarded``: ``raise Discard(reason)`` (outcome ``discard``); any reason is turned into
  text, ``None`` gives the default one;
- ``exit``: the handler raised ``SystemExit`` (``sys.exit(3)``);
- ``terminated``: SIGTERM reached the handler (timeout, cancel or drain); the child then
  exits after reporting;
- ``exception``: anything else (``KeyboardInterrupt`` and ``GeneratorExit`` included);
- ``result``: in a workflow's step, the handler returned a value that cannot be its result
  (not JSON, over 64 KiB of it, nested past 64 levels, or holding NUL:
  :mod:`atlantis.protocol.results`); outcome
  ``discard``, as its effect already happened. Outside workflows such a value is stored as
  null instead, and one warning line goes to the attempt's stderr. A value holding NaN or
  an infinity is sent as orjson writes it (null in their place) with ``Done.nulled``
  saying where; the supervisor's policy decides (:mod:`atlantis.protocol.results`).

A handler's return value travels as JSON text in ``Done.result`` (None stays None).

``raise Snooze(seconds)`` gives outcome ``snooze`` with a finite, non-negative delay (a huge
one clipped); ``Snooze`` of NaN, an infinity or a negative fails the attempt (``exception``).
Threads and processes the handler leaves running are reported in ``leftovers`` and ended
(threads by replacing the process); exited children are reaped.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import sys
import threading
from datetime import datetime
from typing import Any

from atlantis.child import tracing
from atlantis.child.channel import Channel
from atlantis.child.exits import Terminated, TermSignal, exit_now
from atlantis.child.text import (
    UNPRINTABLE,
    checkpoint_msg,
    checkpoint_pct,
    child_error,
    describe,
    leftover,
    snooze_delay,
    snooze_problem,
    text_of,
)
from atlantis.child.tree import descendants, kill_descendants
from atlantis.child.watchdog import Watchdog
from atlantis.context import AsyncJobContext, AttemptFlags, JobContext, step_fields
from atlantis.declarations.values import ArgsError, decode_args
from atlantis.errors import Discard, LeaseLost, Snooze, StepError, Suspended
from atlantis.protocol import results
from atlantis.protocol.fence import Fence
from atlantis.protocol.messages import MAX_LEFTOVERS, Checkpoint, Done, ErrorKind, Run, clip
from atlantis.registry import Registration, Registry
from atlantis.steps import StepBook
from atlantis.steps_async import AsyncStepBook


class Baseline:
    """Threads and child processes that existed before the attempt: the app's, not its.

    An app may start a thread or a helper process at import (a metrics exporter, an SDK);
    that is not work a handler left behind, must not be reported, and must not make every
    attempt replace the child.
    """

    def __init__(self) -> None:
        self.threads = {id(t): t for t in threading.enumerate()}
        self.processes = frozenset(descendants())

    def has_thread(self, thread: threading.Thread) -> bool:
        return self.threads.get(id(thread)) is thread


def _thread_name(thread: threading.Thread) -> str:
    try:
        return f"thread {text_of(thread.name, repr)}"
    except Terminated:
        raise
    except BaseException:  # a Thread subclass may make ``name`` anything
        return f"thread {UNPRINTABLE}"


def leftovers(watchdog: threading.Thread, baseline: Baseline) -> list[str]:
    """Threads and processes the handler started and left running (at most MAX_LEFTOVERS)."""
    found = []
    for t in threading.enumerate():
        if t is threading.main_thread() or t is watchdog or baseline.has_thread(t):
            continue
        try:
            if not t.is_alive():
                continue
        except Exception:
            pass
        found.append(leftover(_thread_name(t)))
    processes = descendants()
    if processes:
        import psutil  # loaded by descendants() already
    for p in processes:
        if p in baseline.processes:
            continue
        try:
            found.append(leftover(f"process {p.pid} ({' '.join(p.cmdline())[:120] or p.name()})"))
        except psutil.Error:  # gone, or a zombie: it runs nothing
            continue
    if len(found) > MAX_LEFTOVERS:
        found[MAX_LEFTOVERS - 1:] = [f"... and {len(found) - MAX_LEFTOVERS + 1} more"]
    return found


def reap_zombies(baseline: Baseline) -> None:
    """Reap children that exited (the handler's, or orphans adopted as subreaper).

    Only after the attempt, so a handler that waits for its own subprocess is never robbed
    of its exit status; never the app's own helpers, which their owners wait for.
    """
    processes = descendants(recursive=False)
    if processes:
        import psutil  # loaded by descendants() already
    for p in processes:
        if p in baseline.processes:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                continue
            os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue


def build_args(reg: Registration, text: str) -> Any:
    """The handler's args object from the row's JSON text; raises whatever keeps it from it."""
    return reg.args_type(**decode_args(reg.decl, text))


def _args_message(job: str, exc: BaseException) -> str:
    # issubclass(type(...)): isinstance may consult the exception's own (hostile) __class__
    if issubclass(type(exc), ArgsError):  # its text says what is wrong, naming the field
        text = text_of(exc)
        return text if job in text else f"job {job}: {text}"
    return f"job {job}: the args object could not be built: {describe(exc)}"


def _attribute(obj: object, name: str) -> object:
    try:
        return getattr(obj, name, None)
    except Terminated:
        raise
    except BaseException:
        return UNPRINTABLE


def _call(reg: Registration | None, run: Run, ctx: JobContext, term: TermSignal) -> Done:
    """Run the handler with SIGTERM armed; the ``Done`` of whatever came of it."""
    job_id = run.job_id
    if reg is None:
        return Done(job_id=job_id, outcome="discard", error=child_error(
            "discarded", f"no handler registered for {run.job} in this app"))
    try:
        term.arm()
        try:
            try:
                args = build_args(reg, run.args)
            except Terminated:
                raise
            except BaseException as exc:  # a custom args type may raise anything
                return Done(job_id=job_id, outcome="failed", error=child_error(
                    "args", _args_message(run.job, exc), exc))
            ret = reg.handler(ctx, args)
            if inspect.isawaitable(ret):
                import asyncio  # on the first async handler's run: a sync app never pays it

                ret = asyncio.run(_await(ret, ctx))
        except Terminated:
            raise
        except (Suspended, LeaseLost, StepError) as exc:
            return _stopped(run, ctx, exc)
        except Discard as exc:
            reason = _attribute(exc, "reason")
            return Done(job_id=job_id, outcome="discard", error=child_error(
                "discarded", "discarded by handler" if reason is None else reason))
        except Snooze as exc:
            seconds = _attribute(exc, "seconds")
            problem = snooze_problem(seconds)
            if problem is not None:  # NaN, inf or negative: a clear failure, not a guess
                return Done(job_id=job_id, outcome="failed", error=child_error(
                    "exception", problem, exc))
            return Done(job_id=job_id, outcome="snooze", delay=snooze_delay(seconds))
        except SystemExit as exc:
            code = text_of(_attribute(exc, "code"), repr)
            return Done(job_id=job_id, outcome="failed", error=child_error(
                "exit", f"handler called sys.exit({code})", exc))
        except BaseException as exc:  # a handler's failure, whatever it is, fails the attempt
            if _stop_of(ctx) is not None:  # it caught how its run ended and raised another
                return _stopped(run, ctx, exc)
            return Done(job_id=job_id, outcome="failed", error=child_error(
                "exception", describe(exc), exc))
        if _stop_of(ctx) is not None:  # it caught how its run ended and returned
            return _stopped(run, ctx, None)
        return _completed(run, ret)
    except Terminated as exc:
        term.armed = False
        return Done(job_id=job_id, outcome="failed", error=child_error(
            "terminated", "terminated by SIGTERM", exc))
    finally:
        term.armed = False


async def _await(aw: Any, ctx: JobContext) -> Any:
    try:
        return await aw
    finally:  # the async steps' connection belongs to this loop
        if isinstance(ctx.steps, AsyncStepBook):
            await ctx.steps.aclose()


def _stop_of(ctx: JobContext) -> BaseException | None:
    return ctx.steps.stop if ctx.steps is not None else None


def _stopped(run: Run, ctx: JobContext, raised: BaseException | None) -> Done:
    """The ``Done`` of a run its handler steps ended, or failed: a durable sleep suspends
    it, a lost lease or an unknown COMMIT fails it (kind ``lease``, ``steps``), a step's
    misuse fails it with the step's kind; a handler that caught how its run ended and went
    on (``raised`` is then what it did instead) fails with kind ``swallowed``."""
    stop = _stop_of(ctx)
    if stop is not None and raised is not stop:
        name = type(stop).__name__
        return Done(job_id=run.job_id, outcome="failed", error=child_error(
            "swallowed", f"the handler caught atlantis.{name} ({describe(stop)}) and went on; "
                         "let it propagate (catch Exception, not BaseException)", raised))
    exc = raised if raised is not None else stop
    assert exc is not None
    if isinstance(exc, Suspended):
        return Done(job_id=run.job_id, outcome="suspend", wake=exc.wake, waits=exc.waits)
    if isinstance(exc, LeaseLost):
        return Done(job_id=run.job_id, outcome="failed", error=child_error(
            "lease", describe(exc), exc))
    kind: ErrorKind = "result" if getattr(exc, "kind", None) == "result" else "steps"
    return Done(job_id=run.job_id, outcome="failed", error=child_error(
        kind, describe(exc), exc))


def _completed(run: Run, value: object) -> Done:
    """The ``Done`` of a handler that returned ``value``: its result, if it can be stored,
    and where it held NaN or an infinity (``nulled``: the supervisor decides what becomes of
    such a result)."""
    nulled = None
    try:
        text, why = results.encode(value)
        nulled = results.non_finite(value, text)
    except Terminated:
        raise
    except BaseException as exc:  # orjson may read a hostile object's attributes
        text, why = None, f"it could not be serialized ({describe(exc)})"
    if why is None:
        return Done(job_id=run.job_id, outcome="complete", result=text,
                    nulled=None if nulled is None else clip(nulled, 4000))
    if run.workflow is not None:  # not retried: the step's effect already happened
        return Done(job_id=run.job_id, outcome="discard", error=child_error(
            "result", f"the step's return value cannot be stored as its result: {why}; "
                      "the step is not retried (its effect already happened)"))
    _warn(f"atlantis: the handler's return value was not stored: {why}")
    return Done(job_id=run.job_id, outcome="complete")


def _warn(line: str) -> None:
    """One line on the attempt's stderr (the supervisor keeps it in the attempt's log)."""
    try:
        sys.stderr.flush()  # what the handler wrote comes first
    except Terminated:
        raise
    except BaseException:  # a stream the handler replaced or closed
        pass
    try:
        os.write(2, (line + "\n").encode("utf-8", "backslashreplace"))
    except OSError:
        pass


def _context(run: Run, flags: AttemptFlags, channel: Channel, owner: int,
             open_: list[bool], registration: Registration | None) -> JobContext:
    def sink(pct: float, text: str) -> None:
        if os.getpid() != owner:
            raise RuntimeError("checkpoint from a process the handler forked: not sent")
        if not open_[0]:
            raise RuntimeError("checkpoint after the attempt ended: not sent")
        channel.send(Checkpoint(job_id=run.job_id, pct=checkpoint_pct(pct), msg=checkpoint_msg(text)))

    is_async = registration is not None and inspect.iscoroutinefunction(registration.handler)
    fence = Fence(run.job_id, run.run_id, run.attempt) if run.run_id else None
    book: StepBook | AsyncStepBook | None = None
    if fence is not None:
        book = (AsyncStepBook if is_async else StepBook)(fence, run.database_url)
    return (AsyncJobContext if is_async else JobContext)(
        steps=book,
        job_id=run.job_id,
        job=run.job,
        queue=run.queue,
        attempt=run.attempt,
        max_attempts=run.max_attempts,
        deadline=datetime.fromisoformat(run.deadline),
        logger=logging.getLogger(f"atlantis.job.{run.job}"),
        database_url=run.database_url,
        flags=flags,
        sink=sink,
        **step_fields(run.workflow),
    )


def run_attempt(registry: Registry, run: Run, flags: AttemptFlags, channel: Channel,
                watchdog: Watchdog, term: TermSignal) -> tuple[Done, bool]:
    """Run one attempt; returns its result and whether this child must exit after it.

    ``flags`` are the ones the watchdog made with ``run``: the handler's ``ctx.cancelled``
    and ``ctx.stopping``."""
    owner = os.getpid()
    channel.job_id = run.job_id
    open_ = [True]
    try:
        try:
            ctx = _context(run, flags, channel, owner, open_,
                           registry.registrations.get(run.job))
        except Exception as exc:  # a Run this child cannot make sense of
            return Done(job_id=run.job_id, outcome="failed", error=child_error(
                "exception", f"the child could not start the attempt: {describe(exc)}", exc)), False
        baseline = Baseline()
        watchdog.attempt_started()
        token = tracing.begin(run.trace, _warn)
        try:
            done = _call(registry.registrations.get(run.job), run, ctx, term)
        finally:
            if os.getpid() != owner:
                # A process the handler forked returned into this loop (os.fork() without
                # os._exit): it must not report a second result on the shared pipe, nor
                # wait for work with no watchdog thread (threads do not survive a fork).
                exit_now(0)
        spans = tracing.end(token, _warn)
        if spans is not None:
            done = dataclasses.replace(done, spans=spans)
        if ctx.steps is not None:
            if isinstance(ctx.steps, StepBook):
                ctx.steps.close()
            if ctx.steps.written:
                done = dataclasses.replace(done, steps=ctx.steps.written)
        must_exit = done.error is not None and done.error.kind == "terminated"
        ctx.flush()  # the last checkpoint goes out before the result
        open_[0] = False
        left = leftovers(watchdog, baseline)
        if left:
            done = dataclasses.replace(done, leftovers=left)
            kill_descendants(baseline.processes)
            must_exit = True  # threads cannot be killed: replace the process
        else:
            reap_zombies(baseline)
        return done, must_exit
    finally:
        open_[0] = False
        watchdog.attempt_ended()
