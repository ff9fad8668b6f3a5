"""What a handler sees of its attempt: :class:`JobContext` and :func:`checkpoint`."""

from __future__ import annotations

import logging
import math
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from atlantis.limits import MAX_CHECKPOINT_CHARS

#: Checkpoints closer together than this are coalesced in the child; the last one always
#: reaches the supervisor before the attempt's result does.
CHECKPOINT_INTERVAL = 0.2

ProgressSink = Callable[[float, str], None]


class AttemptFlags:
    """What the supervisor asked of one attempt while it runs, as its handler sees it.

    The child's watchdog thread makes one for every ``Run`` it receives, before the
    handler starts, and sets ``cancelled`` on that job's ``Cancel`` and ``stopping`` on its
    ``Stopping``; the attempt's :class:`JobContext` is made with it and reads it. A flag
    only ever turns true (one store of a bool: the handler's thread sees it at its next look).
    """

    __slots__ = ("cancelled", "stopping")

    def __init__(self) -> None:
        self.cancelled = False
        self.stopping = False


@dataclass(frozen=True, slots=True)
class Compensating:
    """What a compensation undoes after (``ctx.compensating``, ``atlantis.Compensating``).

    ``step`` is the step whose failure started the compensations, None when the workflow
    was cancelled or timed out; ``error`` says why it failed.
    """

    step: str | None
    error: str | None


_NO_RESULTS: Mapping[str, Any] = types.MappingProxyType({})


@dataclass(eq=False, repr=False)
class JobContext:
    """The attempt a handler is running.

    ``cancelled`` turns true once an operator cancelled this job; ``stopping`` once the
    supervisor drains. A handler that checks them can stop early.
    Its ``repr`` names the job and the attempt only: ``database_url`` (which may hold a
    password) never appears in a log line or a traceback's locals.

    In a workflow's step, ``workflow_id`` and ``step`` name it and ``results`` maps each step
    it depends on (transitively) to that step's result; in a compensation, ``step`` is the
    step it undoes, ``results`` holds that step's result under its name plus that step's
    own ``results``, and ``compensating`` says why. ``idempotency_key`` is the same on every
    attempt: ``"{workflow_id}:{step}"`` forwards, ``"{workflow_id}:{step}:compensate"`` in a
    compensation, the job's id outside workflows.
    """

    job_id: int
    job: str
    queue: str
    attempt: int
    max_attempts: int
    deadline: datetime
    logger: logging.Logger
    database_url: str | None = field(default=None, repr=False)
    flags: AttemptFlags = field(default_factory=AttemptFlags, repr=False)
    """Set by atlantis (the child's watchdog); read them as ``cancelled`` and ``stopping``."""
    sink: ProgressSink | None = field(default=None, repr=False)
    """Where checkpoints go (set by atlantis: the child's events pipe)."""
    workflow_id: int | None = None
    step: str | None = None
    idempotency_key: str = ""
    """``str(job_id)`` when not given (a job outside workflows)."""
    results: Mapping[str, Any] = field(default_factory=lambda: _NO_RESULTS, repr=False)
    compensating: Compensating | None = None
    steps: Any = field(default=None, repr=False)
    """Set by atlantis: the run's handler steps (:class:`atlantis.steps.StepBook`; None
    outside a supervised attempt)."""
    _pending: tuple[float, str] | None = field(default=None, repr=False)
    _last_sent: float = field(default=-math.inf, repr=False)

    def __post_init__(self) -> None:
        if not self.idempotency_key:
            self.idempotency_key = str(self.job_id)

    def __repr__(self) -> str:
        return (f"JobContext(job={self.job!r}, job_id={self.job_id!r}, "
                f"attempt={self.attempt!r}, queue={self.queue!r})")

    @property
    def cancelled(self) -> bool:
        """True once an operator's cancel of this job reached the attempt.

        The handler then has ``--cancel-grace`` to return on its own (the job ends
        ``cancelled`` whatever it returns); after that its process group gets SIGTERM.
        """
        return self.flags.cancelled

    @property
    def stopping(self) -> bool:
        """True once a drain (a deploy, a shutdown) reached the attempt. Not a cancel: a
        handler that wants to yield raises ``atlantis.Snooze(0)``, and its row goes back
        without spending an attempt."""
        return self.flags.stopping

    def connect(self, **kwargs: Any) -> Any:
        """A new ``psycopg.Connection`` to ``ctx.database_url`` (the jobs' database, where
        the handler keeps its own tables too); ``kwargs`` go to ``psycopg.connect``
        (``autocommit=True``, ...). Close it (``with ctx.connect() as conn:``). Under
        ``atlantis.testing.assert_idempotent`` its commits are kill points."""
        if not self.database_url:
            from atlantis.errors import ConfigurationError

            raise ConfigurationError("ctx.connect(): this attempt was given no database URL "
                                     "(ctx.database_url)")
        import psycopg

        return psycopg.connect(self.database_url, **kwargs)

    # ---- handler steps (atlantis.steps) ------------------------------------------------

    def step_key(self, name: str) -> str:
        """A stable idempotency key for what step ``name`` does outside the database, the
        same on every attempt and run: ``"{ctx.idempotency_key}:{name}"``."""
        return f"{self.idempotency_key}:{name}"

    def _book(self) -> Any:
        if self.steps is None:
            from atlantis.errors import StepError

            raise StepError("handler steps run only inside a supervised attempt")
        return self.steps

    def run_step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once across the job's runs: its value (JSON, at most
        64 KiB) is recorded before this returns, and every later run of the job gets the
        record back without calling ``fn``. ``fn``'s effects outside the database are
        at-least-once (a crash between its return and the record runs it again): give
        them ``ctx.step_key(name)`` as an idempotency key. Returns the recorded value."""
        return self._book().run_step(name, fn, args, kwargs)

    def transaction(self, name: str, fn: Callable[..., Any], /, *args: Any,
                    **kwargs: Any) -> Any:
        """Run ``fn(conn, *args, **kwargs)`` in a transaction on the jobs' database and
        commit its writes together with the step's record, fenced on this run still holding
        the job: the writes happen exactly once, whatever crashes. ``fn`` uses only
        ``conn`` and does not commit. Returns the recorded value."""
        return self._book().transaction(name, fn, args, kwargs)

    def sleep(self, name: str, duration: float | timedelta) -> None:
        """Sleep durably: the run ends here (raising :class:`atlantis.Suspended`; let it
        through), no attempt is spent and no process or slot held, and the job runs again
        once ``duration`` (seconds, or a timedelta) has passed since this sleep was first
        reached; then this returns and the handler goes on."""
        from atlantis.steps import sleep_seconds

        self._book().sleep(name, sleep_seconds(duration), None)

    def sleep_until(self, name: str, when: datetime) -> None:
        """Sleep durably until ``when`` (a datetime with a time zone), as :meth:`sleep`."""
        from atlantis.steps import wake_time

        self._book().sleep(name, None, wake_time(when))

    def wait_for_event(self, name: str, event: str,
                       timeout: float | timedelta | None = None) -> Any:
        """Wait durably for an event named ``event`` sent to this job
        (``atlantis.send_event``) and return its payload. One sent before the wait is kept
        for it; each is consumed once, recorded as this step's value. While none has come
        the run ends as :meth:`sleep` ends it; past ``timeout`` (seconds or a timedelta,
        fixed when the wait is first reached) it raises :class:`atlantis.EventTimeout`."""
        from atlantis.steps import event_timeout

        return self._book().wait_for_event(name, event, event_timeout(timeout))

    def spawn(self, name: str, job: str, args: Mapping[str, Any] | None = None,
              **options: Any) -> int:
        """Enqueue job ``job`` with ``args`` as a child of this job, exactly once across its
        runs (the enqueue commits with the step's record, fenced on this run), and return
        its id. ``options`` are :func:`atlantis.enqueue`'s (``delay``, ``run_at``,
        ``priority``, ``queue``). A ``unique`` job whose key a waiting or running job holds
        returns that job's id, recorded as such and not made a child."""
        return int(self._book().spawn(name, job, args, options))

    def spawn_many(self, name: str, job: str, args_list: Iterable[Mapping[str, Any]],
                   **options: Any) -> list[int]:
        """:meth:`spawn` of one child per args of ``args_list`` (at most 10,000), in one
        statement and one step: the batch is enqueued exactly once, and the ids come back
        in the order of ``args_list``. A fan-out of many children costs one round trip, not
        one each."""
        return list(self._book().spawn_many(name, job, args_list, options))

    def join(self, name: str, ids: Iterable[int], results: bool = True) -> list[Any]:
        """Wait durably until every job of ``ids`` has ended, and return their results in
        that order (``results=False``: their end states). While some have not, the run ends
        as :meth:`sleep` ends it, and the last child's end wakes it. A job that ended
        ``dead`` or ``cancelled`` raises :class:`atlantis.ChildFailed`, naming which and
        why. Caps: 100,000 jobs, and 16 MiB of results (past it, ``results=False``)."""
        return list(self._book().join(name, ids, results))

    def checkpoint(self, pct: float, msg: str = "") -> Exception | None:
        """Report progress; never raises. Returns the error that kept it from being sent."""
        try:
            value = float(pct)
            text = msg if type(msg) is str else str(msg)
        except Exception as exc:  # a broken __float__ or __str__ is the handler's, not ours
            return exc
        now = time.monotonic()
        if now - self._last_sent < CHECKPOINT_INTERVAL:
            self._pending = (value, text)
            return None
        self._pending = None
        self._last_sent = now
        return self._send(value, text)

    def flush(self) -> Exception | None:
        """Send a coalesced checkpoint that has not gone out yet."""
        if self._pending is None:
            return None
        value, text = self._pending
        self._pending = None
        self._last_sent = time.monotonic()
        return self._send(value, text)

    def _send(self, pct: float, msg: str) -> Exception | None:
        if self.sink is None:
            return RuntimeError("checkpoint outside a supervised attempt")
        # Keep the frame small; the row keeps fewer characters anyway.
        try:
            self.sink(pct, msg[:MAX_CHECKPOINT_CHARS])
        except Exception as exc:
            return exc
        return None


@dataclass(eq=False, repr=False)
class AsyncJobContext(JobContext):
    """What an ``async def`` handler gets: a :class:`JobContext` whose step methods are
    awaitable (``await ctx.run_step(...)``, with an async or a sync ``fn``)."""

    async def run_step(self, name: str, fn: Callable[..., Any], /,
                       *args: Any, **kwargs: Any) -> Any:
        """As :meth:`JobContext.run_step`; ``fn`` may be async."""
        return await self._book().run_step(name, fn, args, kwargs)

    async def transaction(self, name: str, fn: Callable[..., Any], /,
                          *args: Any, **kwargs: Any) -> Any:
        """As :meth:`JobContext.transaction`: ``fn(conn, ...)`` gets a
        ``psycopg.AsyncConnection`` and may be async."""
        return await self._book().transaction(name, fn, args, kwargs)

    async def sleep(self, name: str, duration: float | timedelta) -> None:  # type: ignore[override]
        """As :meth:`JobContext.sleep`."""
        from atlantis.steps import sleep_seconds

        await self._book().sleep(name, sleep_seconds(duration), None)

    async def sleep_until(self, name: str, when: datetime) -> None:  # type: ignore[override]
        """As :meth:`JobContext.sleep_until`."""
        from atlantis.steps import wake_time

        await self._book().sleep(name, None, wake_time(when))


    async def wait_for_event(self, name: str, event: str,
                             timeout: float | timedelta | None = None) -> Any:
        """As :meth:`JobContext.wait_for_event`."""
        from atlantis.steps import event_timeout

        return await self._book().wait_for_event(name, event, event_timeout(timeout))


    async def spawn(self, name: str, job: str,  # type: ignore[override]
                    args: Mapping[str, Any] | None = None, **options: Any) -> int:
        """As :meth:`JobContext.spawn`."""
        return int(await self._book().spawn(name, job, args, options))

    async def spawn_many(self, name: str, job: str,  # type: ignore[override]
                         args_list: Iterable[Mapping[str, Any]], **options: Any) -> list[int]:
        """As :meth:`JobContext.spawn_many`."""
        return list(await self._book().spawn_many(name, job, args_list, options))

    async def join(self, name: str, ids: Iterable[int],  # type: ignore[override]
                   results: bool = True) -> list[Any]:
        """As :meth:`JobContext.join`."""
        return list(await self._book().join(name, ids, results))


def checkpoint(ctx: JobContext, pct: float, msg: str = "") -> Exception | None:
    """``atlantis.checkpoint(ctx, pct, msg)``: same as ``ctx.checkpoint(pct, msg)``."""
    return ctx.checkpoint(pct, msg)


def step_fields(text: str | None) -> dict[str, Any]:
    """The :class:`JobContext` fields of a workflow's step from its context: the JSON text
    of ``atlantis.step_context`` (``Run.workflow``); none outside workflows (None).

    ValueError (or orjson's JSONDecodeError, one) says what is wrong with a malformed one.
    """
    if text is None:
        return {}
    doc = orjson.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("a step's context must be a JSON object")
    workflow_id, step = doc.get("workflow_id"), doc.get("step")
    compensation, results = doc.get("compensation", False), doc.get("results")
    results = {} if results is None else results
    comp = doc.get("compensating")
    if (type(workflow_id) is not int or type(step) is not str
            or type(compensation) is not bool or type(results) is not dict):
        raise ValueError("a step's context needs workflow_id (an integer), step (a string), "
                         "compensation (a boolean) and results (an object)")
    compensating = None
    if comp is not None:
        why = comp.get("error") if isinstance(comp, dict) else None
        failed = comp.get("step") if isinstance(comp, dict) else None
        if not (isinstance(comp, dict) and isinstance(failed, str | None)
                and isinstance(why, str | None)):
            raise ValueError("a step's compensating must be null or an object of step and error")
        compensating = Compensating(step=failed, error=why)
    key = f"{workflow_id}:{step}:compensate" if compensation else f"{workflow_id}:{step}"
    return {"workflow_id": workflow_id, "step": step, "idempotency_key": key,
            "results": types.MappingProxyType(results), "compensating": compensating}
