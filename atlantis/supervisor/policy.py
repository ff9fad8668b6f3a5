"""The supervisor's decisions, as pure functions: no I/O, no clock, no database.

What an attempt's end means for its row (:func:`decide`), when a lease is lost, when an
attempt has timed out or must be killed, how long to back off. The services call these;
the unit tests call them directly. The fenced SQL statement that writes the outcome still
has the last word on whether the attempt owns its row at all.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from tenacity import RetryCallState, Retrying
from tenacity.wait import wait_base, wait_exponential, wait_random_exponential

from atlantis.limits import MAX_ERROR_TEXT, MAX_PROGRESS_MSG
from atlantis.protocol import framing, results
from atlantis.protocol.messages import ChildError, Done
from atlantis.protocol.messages import clip as cut
from atlantis.units import format_duration, format_size

NextState = Literal["complete", "available", "dead", "cancelled"]
StopReason = Literal["timeout", "memory", "tasks", "drain", "cancel", "lease", "protocol"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The supervisor's verdict on one attempt's end: what its row becomes, as written.

    (The handler's own word on how it ended is the protocol's ``Outcome``: complete, failed,
    discard, snooze; the verdict also weighs timeouts, cancels, limits and retries.)

    ``spent`` is whether it counts as one of the job's attempts (a snooze or a release
    does not). A row that goes back to ``available`` may run again after ``delay`` seconds,
    or, when ``backoff`` is given (a failed attempt with attempts left), after the job's
    backoff for this attempt, at most ``backoff`` seconds (``--max-backoff``). That delay
    is computed where the row is written, by ``atlantis.retry_delay`` (store/live/claims.sql): the
    one home of the retry delay, which the rescue applies too.
    """

    state: NextState
    spent: bool
    delay: float = 0.0
    backoff: float | None = None
    error: dict[str, Any] | None = None
    label: str = ""
    """How the attempt ended, for logs and metrics: complete, failed, discard, snooze,
    release, cancelled (the state when not given)."""
    result: str | None = None
    """The handler's return value as JSON text, checked (:func:`completed`): the row's
    ``result`` if it ends ``complete``."""
    unstored: str | None = None
    """Why the result the child sent was not stored (outside a workflow: the job completes
    with a null result, and the supervisor logs this)."""
    nulled: str | None = None
    """Where the stored result had NaN or an infinity, stored as null (outside a workflow;
    the supervisor logs this)."""
    wake: str | None = None
    """A suspended run (label ``suspend``): when its row runs again, as the child's handler
    step recorded it (the database's clock); ``waits``: what it waits for."""
    waits: str | None = None

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.state)


RELEASE = Verdict("available", False, label="release")
"""A row given back unspent, at once: drained, or claimed when no child was left to run it."""


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What the supervisor knows of an attempt when it ends."""

    attempt: int
    max_attempts: int
    backoff: float
    timeout: float
    workflow: bool = False
    """The row is a workflow's step (or compensation): a result that cannot be stored
    ends it ``dead`` instead of being dropped."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_snooze: float
    max_backoff: float
    max_memory: int = 0
    max_tasks: int = 0


class _Spread(wait_exponential):
    """tenacity's exponential wait, spread +-25% so that many waiters do not move as one."""

    def __init__(self, base: float, cap: float, rand: float | None) -> None:
        super().__init__(multiplier=base)
        self.cap, self.rand = cap, rand

    def __call__(self, retry_state: RetryCallState) -> float:
        r = random.random() if self.rand is None else self.rand
        return min(super().__call__(retry_state) * (0.75 + 0.5 * r), self.cap)


def backoff_wait(base: float, cap: float, *, full_jitter: bool = False,
                 rand: float | None = None) -> wait_base:
    """The supervisor's one backoff, as a tenacity wait: ``base * 2^(n-1)`` for the n-th
    failure, at most ``cap``; spread +-25%, or drawn from ``[0, that)`` with ``full_jitter``
    (the database reconnects of a fleet, which must not arrive together after an outage).

    The supervisor's own pacing: respawning children, restarting a crashed service, claims,
    schedules and reconnects after an error, the start's wait for the database. Not a job's
    retry delay: a failed attempt's row waits ``atlantis.retry_delay`` (see :class:`Verdict`),
    which the rescue applies too, so that the rule has one home. ``rand`` in [0, 1) makes the
    spread deterministic for tests.
    """
    if full_jitter:
        return wait_random_exponential(multiplier=base, max=cap)
    return _Spread(base, cap, rand)


_RETRYING = Retrying()


def backoff(base: float, failures: int, *, cap: float, full_jitter: bool = False,
            rand: float | None = None) -> float:
    """:func:`backoff_wait` after ``failures`` failures (none: no wait)."""
    if base <= 0 or failures <= 0:
        return 0.0
    state = RetryCallState(_RETRYING, None, (), {})
    state.attempt_number = failures
    return float(backoff_wait(base, cap, full_jitter=full_jitter, rand=rand)(state))


def clamp_delay(seconds: float, cap: float) -> float:
    """A delay fit for ``make_interval``: finite, not negative, at most ``cap``."""
    if not math.isfinite(seconds) or seconds < 0:
        return 0.0 if not seconds > 0 else cap
    return min(seconds, cap)


def clip(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """Text fit for a row: cleaned (no NUL, no lone surrogate) and at most ``limit`` chars."""
    return cut(framing.clean(text), limit)


def progress_text(msg: str) -> str:
    """A checkpoint's message as its row keeps it: cleaned, its first
    :data:`~atlantis.limits.MAX_PROGRESS_MSG` characters, as the database's
    ``atlantis.progress_text`` cuts it (the renew and finish statements ask that too). No
    note of what was cut: the row would not keep it."""
    return framing.clean(msg)[:MAX_PROGRESS_MSG]


def out_of_attempts(attempt: int, max_attempts: int) -> bool:
    """Whether a failed attempt was its job's last: the row ends ``dead``. The rescue asks
    the database's ``atlantis.out_of_attempts``, the same rule (tests/test_rules.py)."""
    return attempt >= max_attempts


def failure(facts: AttemptFacts, limits: Limits, kind: str, message: str, **more: Any) -> Verdict:
    """A failed attempt: retried after a backoff while attempts remain, else dead."""
    return failed(facts, limits, {"attempt": facts.attempt, "kind": kind,
                                  "message": clip(message), **more})


def failed(facts: AttemptFacts, limits: Limits, error: dict[str, Any]) -> Verdict:
    """A failed attempt with its ``error``: back to ``available`` to wait for the job's
    backoff while attempts remain (the delay is the database's, see :class:`Verdict`),
    else ``dead``."""
    if out_of_attempts(facts.attempt, facts.max_attempts):
        return Verdict("dead", True, error=error, label="failed")
    return Verdict("available", True, backoff=limits.max_backoff, error=error, label="failed")


def forced(facts: AttemptFacts, limits: Limits, reason: StopReason | None,
           detail: str = "", cancelled: bool = False) -> Verdict | None:
    """The outcome when the supervisor stopped the attempt itself, whatever the child said.

    A cancel an operator requested wins over everything: the handler may have returned,
    raised, timed out or been drained meanwhile; the job ends ``cancelled``.
    """
    if cancelled or reason == "cancel":
        return Verdict("cancelled", True, error=cancel_error(facts))
    if reason == "timeout":
        return failure(facts, limits, "timeout", f"timeout after {format_duration(facts.timeout)}")
    if reason == "memory":
        return failure(facts, limits, "memory",
                       f"memory limit ({format_size(limits.max_memory)}) exceeded")
    if reason == "tasks":
        return failure(facts, limits, "tasks",
                       f"task limit ({limits.max_tasks} processes and threads) exceeded "
                       "(--max-tasks-per-child)")
    if reason == "protocol":
        return failure(facts, limits, "protocol", f"protocol violation: {detail}")
    if reason == "drain":
        return RELEASE
    return None


def cancel_error(facts: AttemptFacts) -> dict[str, Any]:
    """The error of an attempt stopped for a cancel. The supervisor does not know who asked:
    the finish statement (queries.sql) completes it with ``atlantis.cancel_entry``, the
    entry every cancel writes (the message from the row's ``cancelled_by``, "cancelled by
    alice", and ``by``)."""
    return {"attempt": facts.attempt, "kind": "cancelled", "message": "cancelled by an operator"}


def _child_error(facts: AttemptFacts, err: ChildError | None, default_kind: str) -> dict[str, Any]:
    if err is None:
        return {"attempt": facts.attempt, "kind": default_kind, "message": default_kind}
    out: dict[str, Any] = {"attempt": facts.attempt, "kind": err.kind, "message": clip(err.message)}
    if err.traceback is not None:
        out["traceback"] = clip(err.traceback)
    return out


def decide(facts: AttemptFacts, limits: Limits, done: Done, reason: StopReason | None = None,
           cancelled: bool = False) -> Verdict:
    """The next state of a row whose attempt's child reported ``done``."""
    if cancelled and done.outcome in ("failed", "discard"):
        # Cancelled all the same; the failure is kept in the history before the cancel.
        error = _child_error(facts, done.error, "exception")
        return Verdict("cancelled", True, error=error, label="cancelled")
    stopped = forced(facts, limits, reason, cancelled=cancelled)
    if stopped is not None:
        return stopped
    if done.outcome == "complete":
        return completed(facts, done.result, done.nulled)
    if done.outcome == "suspend":  # a durable sleep: no attempt spent, no cap on the time
        return suspended(facts, limits, done)
    if done.outcome == "snooze":
        return Verdict("available", False, delay=clamp_delay(done.delay, limits.max_snooze),
                       label="snooze")
    error = _child_error(facts, done.error, "discarded" if done.outcome == "discard" else "exception")
    if done.outcome == "discard":
        return Verdict("dead", True, error=error, label="discard")
    return failed(facts, limits, error)


def suspended(facts: AttemptFacts, limits: Limits, done: Done) -> Verdict:
    """A durable sleep: back to ``available`` at its wake time, the attempt given back; a
    wake time that is no time with a zone (a forged frame) fails the attempt instead."""
    try:
        ok = datetime.fromisoformat(done.wake or "").utcoffset() is not None
    except ValueError:
        ok = False
    if not ok:
        return failed(facts, limits, {"attempt": facts.attempt, "kind": "steps", "message":
                                      f"a suspend with no wake time: {cut(str(done.wake), 60)}"})
    return Verdict("available", False, label="suspend", wake=done.wake,
                   waits=cut(framing.clean(done.waits or "sleep"), 200))


def completed(facts: AttemptFacts, result: str | None, nulled: str | None = None) -> Verdict:
    """A handler that returned: ``complete`` with its result, checked again here (the child
    checked it, but a handler may forge its frame), so that no result can fail the finish
    statement. One that cannot be stored ends a workflow's step ``dead`` (kind ``result``,
    not retried: its effect already happened); outside workflows it is dropped.

    A result that held NaN or an infinity (``nulled``: where; the child's JSON has null in
    their place) is never changed silently: it ends a workflow's step ``dead`` the same
    way, since the next step would read null; outside workflows it is stored with the nulls
    and the supervisor logs a warning naming the job (``Verdict.nulled``)."""
    stored, why = (None, None) if result is None else results.check(result)
    if why is None and nulled is not None and facts.workflow:
        why = f"it holds NaN or an infinity, which JSON cannot carry ({nulled})"
    if why is None:
        return Verdict("complete", True, result=stored,
                       nulled=None if stored is None else nulled)
    if facts.workflow:
        error = {"attempt": facts.attempt, "kind": "result",
                 "message": clip(f"the result the child sent cannot be stored: {why}; the step "
                                 "is not retried (its effect already happened)")}
        return Verdict("dead", True, error=error, label="discard")
    return Verdict("complete", True, unstored=why)


def decide_exit(facts: AttemptFacts, limits: Limits, returncode: int,
                reason: StopReason | None = None, detail: str = "",
                cancelled: bool = False, said: str = "") -> Verdict:
    """The next state of a row whose attempt's child died without reporting a result.

    ``said`` is why the child said it stopped the attempt itself, if it did (a lost pipe,
    no lease renewal...): it replaces the guess that a SIGKILL means memory.
    """
    if cancelled and reason in (None, "memory", "tasks", "protocol", "timeout"):
        ended = decide_exit(facts, limits, returncode, reason, detail, said=said)
        return Verdict("cancelled", True, error=ended.error, label="cancelled")
    stopped = forced(facts, limits, reason, detail, cancelled=cancelled)
    if stopped is not None:
        return stopped
    more: dict[str, Any] = ({"exit_code": returncode} if returncode >= 0
                            else {"signal": -returncode})
    message = describe_exit(returncode)
    if said:
        message = f"{describe_exit(returncode, hint=False)}: {said}"
    return failure(facts, limits, "crash", message, **more)


def describe_exit(returncode: int, hint: bool = True) -> str:
    """How a child ended, in the words ``last_error`` uses (``hint``: a guess at why)."""
    import signal

    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        guess = " (perhaps out of memory?)" if hint and -returncode == signal.SIGKILL else ""
        return f"killed by {name}{guess}"
    return f"child exited with code {returncode}"


# ---- leases and timeouts ------------------------------------------------------------------

def dead_before_end(heartbeat: float) -> float:
    """How long before its lease's end every process of an attempt that was not renewed is
    dead: a quarter of the heartbeat, at most 30 s (500 ms at ``heartbeat 2s``). The lease's
    end is counted from the monotonic time taken before the claiming or renewing statement
    went out, so it is never later than the row's ``claimed_until`` (PostgreSQL's ``now()``
    at that statement's start, plus the heartbeat): no other worker can claim the row
    before that time has passed."""
    return min(heartbeat * 0.25, 30.0)


def kill_slack(heartbeat: float) -> float:
    """Time between the three that stop an attempt whose lease is running out, and left for
    the last kill to land (a wake-up late on a loaded machine, a tree to stop and kill):
    15% of the heartbeat, at most 1.5 s."""
    return min(heartbeat * 0.15, 1.5)


def lease_margin(heartbeat: float) -> float:
    """How long before its lease's end the supervisor stops an attempt it could not renew:
    :func:`dead_before_end` plus :func:`kill_slack`.

    Renewals are due every heartbeat/3, so a healthy attempt is never near this point. A
    live supervisor acts first and records why; the child's own watchdog
    (:func:`child_margin`) and the lease keeper (:func:`keeper_margin`, a process that
    acts whatever the child and the supervisor can do: a C call holding the GIL, a stopped
    or killed supervisor) follow, all before :func:`dead_before_end`.
    """
    return dead_before_end(heartbeat) + kill_slack(heartbeat)


def keeper_margin(heartbeat: float) -> float:
    """How long before its lease's end the lease keeper (:mod:`atlantis.keeper`) kills an
    attempt that heard no renewal: half a slack after the supervisor would have."""
    return dead_before_end(heartbeat) + kill_slack(heartbeat) / 2


def child_margin(heartbeat: float) -> float:
    """How long before its lease's end the child's own watchdog stops an attempt it heard
    no renewal for (the ``Run``'s ``lease_margin``): after the keeper, so that the one
    that works whatever the handler does is the one tested."""
    return dead_before_end(heartbeat) + kill_slack(heartbeat) / 4


def lease_lost(now: float, lease_end: float, heartbeat: float) -> bool:
    return now >= lease_end - lease_margin(heartbeat)


def hold_limit(heartbeat: float, hold: float) -> float:
    """How long a row claimed ahead may wait to start: held longer, it is given back instead.

    Its lease is not renewed while it waits, so it is held for ``hold``
    (``--claim-ahead-hold``) at most, and for no more than a quarter of its heartbeat, which
    leaves it most of its lease when it starts. Checked again when a child is free for it:
    a supervisor that was stalled (stopped, swapped out) must not start a row whose lease
    ran out meanwhile, and which another worker may already run.
    """
    return min(hold, heartbeat / 4)


def renewal_due(now: float, renewed_at: float, heartbeat: float) -> bool:
    return now >= renewed_at + heartbeat / 3


def timed_out(now: float, started: float, timeout: float) -> bool:
    return now >= started + timeout


def cancel_grace_over(now: float, heard_at: float | None, grace: float) -> bool:
    return heard_at is not None and now >= heard_at + grace


def kill_due(now: float, term_sent_at: float | None, grace: float) -> bool:
    return term_sent_at is not None and now >= term_sent_at + grace




def pct_value(pct: float | None) -> float:
    """A checkpoint's percentage as the database clamps it (None stands for NaN)."""
    return math.nan if pct is None else pct
