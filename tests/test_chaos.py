"""The chaos run (``scripts/chaos``): its checks on histories made by hand, and one real run.

The real run takes about a minute of faults and then waits for every job to finish; what it
asserts is correctness only (the history's checks), never how long anything took.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from chaos import check
from chaos.check import Event, History, JobRow, SupervisorFate
from tests.conftest import ROOT

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run_events(job: int, attempt: int, run: str, start: float, *ticks: float,
               end: str = "end") -> list[Event]:
    evs = [Event(job, attempt, run, 100 + attempt, "start", at(start))]
    evs += [Event(job, attempt, run, 100 + attempt, "tick", at(t)) for t in ticks]
    if end:
        evs.append(Event(job, attempt, run, 100 + attempt, end, at(ticks[-1] + 0.01 if ticks
                                                                   else start + 0.01)))
    return evs


def history(**kw: object) -> History:
    base: dict[str, object] = {
        "jobs": [JobRow(1, "chaos.Work", "complete", 2, 13, False)],
        "events": run_events(1, 1, "a", 0.0, 1.0, end="") + run_events(1, 2, "b", 3.0, 3.5),
        "effects": {1: 1}, "cancelled": set(),
        "supervisors": [SupervisorFate("s0", killed=False, alive_at_end=True, stop_code=0)],
    }
    base.update(kw)
    return History(**base)  # type: ignore[arg-type]


def failed(h: History) -> set[str]:
    return {r.name for r in check.check(h) if not r.ok}


def test_a_clean_history_passes_every_check() -> None:
    assert failed(history()) == set()


def test_an_attempt_that_ticks_after_the_next_one_started_is_an_overlap() -> None:
    # Attempt 1 lost its lease but its process went on ticking after attempt 2 started.
    h = history(events=run_events(1, 1, "a", 0.0, 1.0, 3.2, end="")
                + run_events(1, 2, "b", 3.0, 3.5))
    results = {r.name: r for r in check.check(h)}
    overlap = results["no two attempts of one job overlap"]
    assert not overlap.ok
    assert "attempt 1 (pid 101) tick" in overlap.examples[0]
    # Also across a middle execution that ended early: the running maximum counts.
    h = history(events=run_events(1, 1, "a", 0.0, 9.0, end="") + run_events(1, 2, "b", 1.0)
                + run_events(1, 3, "c", 5.0))
    assert "no two attempts of one job overlap" in failed(h)


def test_effects_missing_or_doubled_fail() -> None:
    assert "each completed job's effect present exactly once" in failed(history(effects={}))
    assert "each completed job's effect present exactly once" in failed(history(effects={1: 2}))


def test_states_retries_and_cancels_are_checked() -> None:
    assert "every job complete, dead or cancelled" in failed(
        history(jobs=[JobRow(1, "chaos.Work", "available", 2, 13, False)]))
    early = history(jobs=[JobRow(1, "chaos.Work", "dead", 2, 13, False)], effects={})
    assert "dead only after all its retries, none past them" in failed(early)
    assert "dead only after all its retries, none past them" not in failed(
        history(jobs=[JobRow(1, "chaos.Doomed", "dead", 3, 3, False)], effects={}))
    unasked = history(jobs=[JobRow(1, "chaos.Work", "cancelled", 2, 13, False)], effects={})
    assert "cancelled if and only if a cancel was accepted" in failed(unasked)
    unasked.cancelled = {1}
    assert failed(unasked) == set()
    # A cancel that was accepted must end the job cancelled, whatever the attempt did.
    ignored = history(cancelled={1}, cancel_accepted={1})
    assert "cancelled if and only if a cancel was accepted" in failed(ignored)
    assert "none stuck running after its lease" in failed(
        history(jobs=[JobRow(1, "chaos.Work", "running", 2, 13, True)]))


def test_orphans_and_dead_supervisors_fail() -> None:
    assert "no orphan process survives" in failed(history(orphans=["pid 7"]))
    died = [SupervisorFate("s0", killed=False, alive_at_end=False)]
    assert "every supervisor not killed is alive (and stops cleanly)" in failed(
        history(supervisors=died))
    killed = [SupervisorFate("s0", killed=True, alive_at_end=False),
              SupervisorFate("s0#1", killed=False, alive_at_end=True, stop_code=0)]
    assert failed(history(supervisors=killed)) == set()


@pytest.mark.timeout(420)
def test_a_minute_of_chaos_keeps_every_promise() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "--minutes", "1", "--supervisors", "2", "--seed", "7"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-6000:]}"
    assert "FAIL" not in proc.stdout
