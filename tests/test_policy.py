"""The supervisor's decisions as pure functions: no database, no processes."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from atlantis.protocol.messages import ChildError, Done
from atlantis.supervisor import policy
from atlantis.supervisor.claimmode import ClaimMode
from atlantis.supervisor.policy import AttemptFacts, Limits, Verdict

LIMITS = Limits(max_snooze=3600.0, max_backoff=60.0, max_memory=512 * 1024**2)


def facts(attempt: int = 1, max_attempts: int = 3, base: float = 10.0) -> AttemptFacts:
    return AttemptFacts(attempt, max_attempts, base, 7200.0)


def test_complete_spends_the_attempt() -> None:
    out = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="complete"))
    assert (out.state, out.spent, out.error) == ("complete", True, None)


def test_failure_retries_with_backoff_while_attempts_remain() -> None:
    err = ChildError(kind="exception", message="ValueError: x", traceback="tb")
    out = policy.decide(facts(2), LIMITS, Done(job_id=1, outcome="failed", error=err))
    # The delay itself is the database's (atlantis.retry_delay, tests/test_leases.py): the
    # verdict asks for the job's backoff, capped by --max-backoff.
    assert out.state == "available" and out.spent and out.backoff == LIMITS.max_backoff
    assert out.error == {"attempt": 2, "kind": "exception", "message": "ValueError: x",
                         "traceback": "tb"}
    last = policy.decide(facts(3), LIMITS, Done(job_id=1, outcome="failed", error=err))
    assert last.state == "dead" and last.error is not None and last.error["attempt"] == 3


def test_the_attempt_number_comes_from_the_supervisor_not_the_child() -> None:
    err = ChildError(kind="exception", message="m")
    out = policy.decide(facts(2), LIMITS, Done(job_id=1, outcome="failed", error=err))
    assert out.error is not None and out.error["attempt"] == 2


def test_discard_goes_dead_at_once() -> None:
    err = ChildError(kind="discarded", message="123")
    out = policy.decide(facts(1), LIMITS, Done(job_id=1, outcome="discard", error=err))
    assert (out.state, out.spent) == ("dead", True)
    assert out.error == {"attempt": 1, "kind": "discarded", "message": "123"}


@pytest.mark.parametrize(("asked", "given"), [
    (5.0, 5.0), (1e13, 3600.0), (math.inf, 3600.0), (math.nan, 0.0), (-3.0, 0.0), (-math.inf, 0.0),
])
def test_snooze_delays_are_clamped(asked: float, given: float) -> None:
    out = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="snooze", delay=asked))
    assert (out.state, out.spent, out.delay) == ("available", False, given)


def test_a_suspend_gives_the_attempt_back_until_its_wake_time_uncapped() -> None:
    wake = "2999-01-01T00:00:00+00:00"  # past --max-snooze: a durable sleep is not a snooze
    out = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="suspend", wake=wake,
                                              waits="sleep:nap"))
    assert (out.state, out.spent, out.label, out.wake, out.waits) == (
        "available", False, "suspend", wake, "sleep:nap")


@pytest.mark.parametrize("wake", [None, "", "tomorrow", "2030-01-01T00:00:00"])
def test_a_suspend_without_a_zoned_wake_time_fails_its_attempt(wake: str | None) -> None:
    out = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="suspend", wake=wake))
    assert (out.state, out.spent) == ("available", True)  # a failure, retried
    assert out.error is not None and out.error["kind"] == "steps"
    assert out.wake is None


def test_a_cancel_wins_over_a_suspend() -> None:
    out = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="suspend",
                                              wake="2999-01-01T00:00:00+00:00"), cancelled=True)
    assert out.state == "cancelled"


def test_backoff_is_exponential_jittered_and_capped() -> None:
    assert policy.backoff(10, 1, cap=60, rand=0.0) == 7.5
    assert policy.backoff(10, 1, cap=60, rand=0.999) < 12.5
    assert policy.backoff(10, 3, cap=60, rand=0.5) == 40.0
    assert policy.backoff(10, 30, cap=60, rand=0.5) == 60.0
    assert policy.backoff(10, 2**31 - 2, cap=60, rand=0.5) == 60.0  # no overflow
    assert policy.backoff(0, 5, cap=60) == 0.0
    full = [policy.backoff(10, 3, cap=60, full_jitter=True) for _ in range(50)]
    assert all(0 <= d <= 40 for d in full) and min(full) < 20 < max(full)
    assert policy.backoff(10, 30, cap=60, full_jitter=True) <= 60


def test_the_supervisor_paces_itself_with_one_backoff() -> None:
    """Reconnects, the start's wait for the database, respawns, restarts, claims and
    schedules all wait :func:`policy.backoff_wait`: no module but the policy picks a wait."""
    package = Path(policy.__file__).resolve().parent.parent
    others = [path.relative_to(package) for path in package.rglob("*.py")
              if path.name != "policy.py" and re.search(
                  r"\bwait_(random_)?exponential|\bwait_exponential_jitter|\b2(\.0)? ?\*\* ?[a-z(]",
                  path.read_text("utf-8"))]
    assert others == []


@pytest.mark.parametrize(("reason", "state", "kind", "spent"), [
    ("timeout", "available", "timeout", True),
    ("memory", "available", "memory", True),
    ("protocol", "available", "protocol", True),
    ("drain", "available", None, False),
    ("cancel", "cancelled", "cancelled", True),
])
def test_a_stop_by_the_supervisor_decides_whatever_the_child_said(
        reason: policy.StopReason, state: str, kind: str | None, spent: bool) -> None:
    out = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="complete"), reason)
    assert out.state == state and out.spent == spent
    assert (out.error or {}).get("kind") == kind
    crashed = policy.decide_exit(facts(), LIMITS, -9, reason)
    assert crashed.state == state and (crashed.error or {}).get("kind") == kind


def test_crash_descriptions() -> None:
    out = policy.decide_exit(facts(), LIMITS, 7)
    assert out.error is not None and out.error["message"] == "child exited with code 7"
    assert out.error["exit_code"] == 7
    out = policy.decide_exit(facts(), LIMITS, -11)
    assert out.error is not None and out.error["message"] == "killed by SIGSEGV"
    assert out.error["signal"] == 11
    assert "perhaps out of memory" in policy.describe_exit(-9)
    assert policy.describe_exit(-200) == "killed by signal 200"


def test_timeout_message_names_the_timeout() -> None:
    out = policy.decide_exit(AttemptFacts(1, 1, 1.0, 7200.0), LIMITS, -15, "timeout")
    assert out.state == "dead" and out.error is not None
    assert out.error["message"] == "timeout after 2h"


def test_error_texts_are_cleaned_and_clipped() -> None:
    err = ChildError(kind="exception", message="bad\x00byte \ud800 " + "x" * 100_000)
    out = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="failed", error=err))
    assert out.error is not None
    message = out.error["message"]
    assert "\x00" not in message and "\\ud800" in message and len(message) < 70_000
    message.encode("utf-8")  # encodable


def test_leases_and_timeouts() -> None:
    assert policy.dead_before_end(2.0) == 0.5 and policy.dead_before_end(600.0) == 30.0
    assert policy.lease_margin(4.0) == pytest.approx(1.6) and policy.lease_margin(600.0) == 31.5
    # The supervisor first, then the keeper, then the child: all before the guaranteed gap.
    for hb in (0.5, 2.0, 3.0, 600.0):
        assert (policy.lease_margin(hb) > policy.keeper_margin(hb) > policy.child_margin(hb)
                > policy.dead_before_end(hb))
    assert not policy.lease_lost(now=10.0, lease_end=12.0, heartbeat=4.0)
    assert policy.lease_lost(now=10.5, lease_end=12.0, heartbeat=4.0)
    assert policy.renewal_due(now=2.0, renewed_at=0.5, heartbeat=4.0)
    assert not policy.renewal_due(now=1.0, renewed_at=0.5, heartbeat=4.0)
    assert policy.timed_out(now=10.0, started=5.0, timeout=5.0)
    assert not policy.timed_out(now=9.9, started=5.0, timeout=5.0)
    assert not policy.kill_due(now=100.0, term_sent_at=None, grace=1.0)
    assert policy.kill_due(now=3.0, term_sent_at=1.0, grace=2.0)


def test_outcome_labels_name_how_the_attempt_ended() -> None:
    err = ChildError(kind="exception", message="m")
    assert policy.decide(facts(1), LIMITS, Done(job_id=1, outcome="failed", error=err)).label == "failed"
    assert policy.decide(facts(3), LIMITS, Done(job_id=1, outcome="failed", error=err)).label == "failed"
    assert policy.decide(facts(), LIMITS, Done(job_id=1, outcome="discard")).label == "discard"
    assert policy.decide(facts(), LIMITS, Done(job_id=1, outcome="snooze", delay=1)).label == "snooze"
    assert policy.decide(facts(), LIMITS, Done(job_id=1, outcome="complete"), "drain").label == "release"
    assert Verdict("complete", True).label == "complete"


def test_a_requested_cancel_wins_over_whatever_the_attempt_did() -> None:
    err = ChildError(kind="exception", message="boom")
    for done in (Done(job_id=1, outcome="complete"), Done(job_id=1, outcome="snooze", delay=5)):
        out = policy.decide(facts(), LIMITS, done, cancelled=True)
        assert out.state == "cancelled" and out.error is not None and out.error["kind"] == "cancelled"
    failed = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="failed", error=err), cancelled=True)
    assert failed.state == "cancelled" and failed.error is not None
    assert failed.error["kind"] == "exception"  # kept; the cancel is appended by the statement
    for reason in ("timeout", "memory", None):
        out = policy.decide_exit(facts(), LIMITS, -9, reason, cancelled=True)
        assert out.state == "cancelled", reason
    drained = policy.decide(facts(), LIMITS, Done(job_id=1, outcome="complete"), "drain", cancelled=True)
    assert drained.state == "cancelled"
    assert policy.cancel_grace_over(now=5.0, heard_at=2.0, grace=3.0)
    assert not policy.cancel_grace_over(now=4.9, heard_at=2.0, grace=3.0)
    assert not policy.cancel_grace_over(now=99.0, heard_at=None, grace=3.0)


def test_the_claim_mode_tells_limited_rows_from_plain_ones() -> None:
    mode = ClaimMode(limited_queues={"q2"}, limited_jobs=frozenset({"ns.Limited"}))
    assert mode.limits_any(["q1"], ["ns.Limited", "ns.Plain"])
    assert mode.limits_any(["q1", "q2"], ["ns.Plain"])
    assert not mode.limits_any(["q1"], ["ns.Plain"])
    assert mode.unlimited(["q1", "q2"], ["ns.Limited", "ns.Plain"]) == (["q1"], ["ns.Plain"])
    assert (mode.ahead, mode.idle_reserved) == (True, 0)  # a fresh supervisor holds ahead
