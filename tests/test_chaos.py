"""The chaos run (``scripts/chaos``): its checks on histories made by hand, and one real run.

The real run takes about a minute of faults and then waits for every job to finish; what it
asserts is correctness only (the history's checks), never how long anything took.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from chaos import check
from chaos.check import (
    Event,
    History,
    JobRow,
    LimitSample,
    StepRow,
    SupervisorFate,
    WorkflowRow,
)
from chaos.durable import DurableHistory, Plan, StepEffect, StepRecord
from chaos.waits import EventRow, Sent, SpawnRecord, WaitHistory, WaitRecord
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


def test_a_grandchild_of_an_attempt_still_running_when_the_next_starts_is_an_overlap() -> None:
    # chaos.Crunch: attempt 1's handler was killed in its C call, but its double-forked
    # grandchild (another pid, recording under the same execution) came out of its own C
    # call after attempt 2 had started.
    grandchild = [Event(1, 1, "a", 999, "c-before", at(0.5)), Event(1, 1, "a", 999, "c-after", at(3.4))]
    h = history(events=run_events(1, 1, "a", 0.0, end="") + grandchild
                + run_events(1, 2, "b", 3.0, 3.5))
    overlap = {r.name: r for r in check.check(h)}["no two attempts of one job overlap"]
    assert not overlap.ok and "c-after" in overlap.examples[0]
    # Before attempt 2's start, it is no overlap.
    grandchild[1] = Event(1, 1, "a", 999, "c-after", at(2.9))
    assert failed(history(events=run_events(1, 1, "a", 0.0, end="") + grandchild
                          + run_events(1, 2, "b", 3.0, 3.5))) == set()


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
    # Told to exit once drained (tide worker drain --exit): exit 0 is its due, else a failure.
    exited = [SupervisorFate("s0", killed=False, alive_at_end=False, exit_code=0,
                             told_to_exit=True),
              SupervisorFate("s0#1", killed=False, alive_at_end=True, stop_code=0)]
    assert failed(history(supervisors=exited)) == set()
    crashed = [SupervisorFate("s0", killed=False, alive_at_end=False, exit_code=1,
                              told_to_exit=True)]
    assert "every supervisor not killed is alive (and stops cleanly)" in failed(
        history(supervisors=crashed))


def step_row(job: int, wid: int, step: str, state: str = "complete", *, undo: bool = False,
             attempt: int = 1, doomed: bool = False) -> JobRow:
    return JobRow(job, "chaos.Undo" if undo else "chaos.Step", state, attempt, 3, False,
                  workflow_id=wid, step=step, compensation=undo, doomed=doomed)


def workflow_history(**kw: object) -> History:
    """Workflow 10 completed (steps a, b); workflow 20 failed at b (dead after its 3
    attempts), a compensated; each row ran once and recorded its effect under its key."""
    jobs = [step_row(11, 10, "a"), step_row(12, 10, "b"), step_row(21, 20, "a"),
            step_row(22, 20, "b", "dead", attempt=3, doomed=True),
            step_row(23, 20, "a", undo=True)]
    events: list[Event] = []
    for i, j in enumerate(jobs):
        events += run_events(j.id, 1, f"w{i}", 10.0 + i, 10.5 + i)
    base: dict[str, object] = {
        "jobs": jobs, "events": events, "effects": {}, "cancelled": set(),
        "supervisors": [SupervisorFate("s0", killed=False, alive_at_end=True, stop_code=0)],
        "workflows": [WorkflowRow(10, "complete"), WorkflowRow(20, "failed", "failed", "b")],
        "steps": [StepRow(10, "a", "chaos.Undo", 11, None, True),
                  StepRow(10, "b", None, 12, None, True),
                  StepRow(20, "a", "chaos.Undo", 21, 23, True),
                  StepRow(20, "b", None, 22, None, True)],
        "keyed": {"10:a": 1, "10:b": 1, "20:a": 1, "20:a:compensate": 1},
    }
    base.update(kw)
    return History(**base)  # type: ignore[arg-type]


def test_a_clean_workflow_history_passes_every_check() -> None:
    assert failed(workflow_history()) == set()


def test_a_step_effect_missing_or_doubled_fails() -> None:
    name = "each completed step's effect once under its key"
    assert name in failed(workflow_history(keyed={"10:a": 1, "20:a": 1, "20:a:compensate": 1}))
    assert name in failed(workflow_history(
        keyed={"10:a": 2, "10:b": 1, "20:a": 1, "20:a:compensate": 1}))
    # A completed compensation is a row like any other: its effect is there once.
    assert name in failed(workflow_history(keyed={"10:a": 1, "10:b": 1, "20:a": 1}))
    # Plain jobs' effects are keyed by job id; a workflow's rows need none there.
    assert "each completed job's effect present exactly once" not in failed(workflow_history())


def test_a_started_step_left_uncompensated_fails() -> None:
    name = "every started step of a failed or cancelled workflow compensated once"
    # Step a of workflow 20 started and completed; a failure must undo it.
    h = workflow_history(jobs=workflow_history().jobs[:4], keyed={"10:a": 1, "10:b": 1, "20:a": 1},
                         steps=[*workflow_history().steps[:2],
                                StepRow(20, "a", "chaos.Undo", 21, None, True),
                                StepRow(20, "b", None, 22, None, True)])
    assert name in failed(h)
    # The handler's own start counts even where the database saw no attempt begin.
    h = workflow_history(jobs=h.jobs, keyed=h.keyed,
                         steps=[*h.steps[:2], StepRow(20, "a", "chaos.Undo", 21, None, False),
                                h.steps[3]])
    assert name in failed(h)
    # A step that never started is never compensated.
    never = workflow_history(
        events=[e for e in workflow_history().events if e.job_id != 21],
        steps=[*workflow_history().steps[:2], StepRow(20, "a", "chaos.Undo", 21, 23, False),
               workflow_history().steps[3]])
    assert name in failed(never)


def test_a_workflow_left_running_or_compensation_failed_without_cause_fails() -> None:
    name = "no workflow left running or compensating"
    for state in ("running", "compensating"):
        h = workflow_history(workflows=[WorkflowRow(10, "complete"),
                                        WorkflowRow(20, state, "failed", "b")])
        assert name in failed(h)
    unexplained = [WorkflowRow(10, "complete"), WorkflowRow(20, "compensation_failed", "failed", "b")]
    assert name in failed(workflow_history(workflows=unexplained))
    # With its compensation dead (after all its attempts) it is a workflow that could not be
    # undone, which the run reports but does not hold against the product.
    jobs = [*workflow_history().jobs[:4], step_row(23, 20, "a", "dead", undo=True, attempt=3)]
    assert failed(workflow_history(workflows=unexplained, jobs=jobs,
                                   keyed={"10:a": 1, "10:b": 1, "20:a": 1})) == set()


def test_a_workflow_state_that_disagrees_with_its_rows_fails() -> None:
    name = "each workflow's state agrees with its rows"
    base = workflow_history()
    jobs = list(base.jobs)
    # Complete, yet a step is not.
    assert name in failed(workflow_history(jobs=[step_row(11, 10, "a"),
                                                 step_row(12, 10, "b", "dead", attempt=3),
                                                 *jobs[2:]]))
    # Complete, though a step outlasts its timeout: the timeout was not enforced.
    assert name in failed(workflow_history(workflows=[WorkflowRow(10, "complete", slow=True),
                                                      WorkflowRow(20, "failed", "failed", "b")]))
    # Failed at a step whose row completed.
    assert name in failed(workflow_history(workflows=[WorkflowRow(10, "complete"),
                                                      WorkflowRow(20, "failed", "failed", "a")]))
    # Cancelled: only if asked, and always if asked while it ran.
    cancelled = [WorkflowRow(10, "complete"), WorkflowRow(20, "cancelled", "cancelled")]
    step_cancelled = [*jobs[:3], step_row(22, 20, "b", "cancelled"), jobs[4]]
    assert name in failed(workflow_history(workflows=cancelled, jobs=step_cancelled))
    assert failed(workflow_history(workflows=cancelled, jobs=step_cancelled,
                                   workflow_cancelled={20}, workflow_cancel_running={20})) == set()
    assert name in failed(workflow_history(workflow_cancelled={20}, workflow_cancel_running={20}))
    # A step's row is cancelled only in a workflow that stopped; a compensation's never.
    assert name in failed(workflow_history(jobs=[step_row(11, 10, "a"),
                                                 step_row(12, 10, "b", "cancelled"), *jobs[2:]]))
    assert name in failed(workflow_history(jobs=[*jobs[:4],
                                                 step_row(23, 20, "a", "cancelled", undo=True)]))


def test_a_handler_that_saw_a_wrong_context_fails() -> None:
    events = [*workflow_history().events, Event(12, 1, "w1", 101, "bad-context", at(11.2))]
    assert "each step saw its key, its predecessors' results" in failed(
        workflow_history(events=events))


LIMIT = "the limit was never exceeded"


def limited_history(**kw: object) -> History:
    """chaos.Limited (2 by account, 3 in all): jobs 31, 32 of account a0 run at once, then
    33 (a0) starts as 31 ends; 34 (a1) runs beside them (3 in all); 35 (a0) runs after
    a killed attempt of 33 was cut short (its last tick at 2.5)."""
    jobs = [JobRow(i, "chaos.Limited", "complete", 1, 13, False) for i in range(31, 36)]
    events = (run_events(31, 1, "l1", 0.0, 1.0) + run_events(32, 1, "l2", 0.5, 1.5)
              + run_events(33, 1, "l3", 1.01, 2.5, end="") + run_events(34, 1, "l4", 0.2, 2.0)
              + run_events(35, 1, "l5", 2.6, 3.0))
    base: dict[str, object] = {
        "jobs": jobs, "events": events, "effects": {i: 1 for i in range(31, 36)},
        "cancelled": set(),
        "supervisors": [SupervisorFate("s0", killed=False, alive_at_end=True, stop_code=0)],
        "limited": {31: "a0", 32: "a0", 33: "a0", 34: "a1", 35: "a0"},
        "samples": [LimitSample(at(0.6), {"a0": 2, "a1": 1}), LimitSample(at(2.7), {"a0": 1})],
    }
    base.update(kw)
    return History(**base)  # type: ignore[arg-type]


def test_a_limit_held_passes() -> None:
    h = limited_history()
    assert failed(h) == set()
    result = next(r for r in check.check(h) if r.name == LIMIT)
    assert "peak 2 per account, 3 in all, 0 over" in result.detail


def test_a_limit_exceeded_is_reported_with_its_key_time_and_count() -> None:
    # Job 33 starts before 31 ended: three of account a0 at once, four in all.
    events = [e for e in limited_history().events if e.run != "l3"]
    events += run_events(33, 1, "l3", 0.9, 2.5, end="")
    result = next(r for r in check.check(limited_history(events=events)) if r.name == LIMIT)
    assert not result.ok
    assert any(x.startswith("account a0: 3 executions at once at 2026-01-01T00:00:00.900000")
               and "(limit 2)" in x and "33#1" in x for x in result.examples)
    assert any("4 executions at once in all" in x and "(limit 3)" in x for x in result.examples)
    # An execution cut short counts until its last event: a start after it is no overlap,
    # nor beside one killed before any event but its start.
    assert LIMIT not in failed(limited_history())
    killed = [*limited_history().events, *run_events(36, 1, "l6", 0.7, end="")]
    assert LIMIT not in failed(limited_history(events=killed, limited={
        **limited_history().limited, 36: "a0"}))
    # The database's side: a sample over a limit fails even when no interval shows it.
    over = limited_history(samples=[LimitSample(at(1.0), {"a0": 3}),
                                    LimitSample(at(1.1), {"a0": 2, "a1": 2})])
    result = next(r for r in check.check(over) if r.name == LIMIT)
    assert not result.ok
    assert "account a0: 3 rows running at 2026-01-01T00:00:01.000000+00:00 (limit 2)" in (
        result.examples)
    assert any(x.startswith("4 rows running in all") for x in result.examples)


EFFECTS = "each transaction step's effect exactly once"
BODIES = "no step body ran again after its record"
DURABLE = "each durable job finished, its steps recorded, its sleep kept"


def durable_history(**kw: object) -> History:
    """chaos.Durable job 41 (two rounds, the sleep after the first): run r1 runs step-0 and
    pay-0 and sleeps until 1.5; run r2, at 2.0, wakes and runs step-1 and pay-1."""
    ev = [("r1", "start", 0.0), ("r1", "body:step-0", 0.1), ("r1", "suspend", 0.4),
          ("r2", "start", 2.0), ("r2", "woke", 2.1), ("r2", "body:step-1", 2.2),
          ("r2", "end", 2.5)]
    records = [StepRecord(41, "step-0", "step", "r1", 1, at(0.2)),
               StepRecord(41, "pay-0", "transaction", "r1", 1, at(0.3)),
               StepRecord(41, "nap", "sleep", "r1", 1, at(0.35), wake=at(1.5)),
               StepRecord(41, "step-1", "step", "r2", 1, at(2.3)),
               StepRecord(41, "pay-1", "transaction", "r2", 1, at(2.4))]
    base: dict[str, object] = {
        "jobs": [JobRow(41, "chaos.Durable", "complete", 1, 13, False)],
        "events": [Event(41, 1, run, 100, name, at(t)) for run, name, t in ev],
        "effects": {41: 1}, "cancelled": set(),
        "supervisors": [SupervisorFate("s0", killed=False, alive_at_end=True, stop_code=0)],
        "durable": DurableHistory({41: Plan(2, 0)}, records,
                                  [StepEffect(41, "pay-0", "r1"), StepEffect(41, "pay-1", "r2")]),
    }
    base.update(kw)
    return History(**base)  # type: ignore[arg-type]


def with_durable(**kw: object) -> DurableHistory:
    d = durable_history().durable
    return DurableHistory(**{"plans": d.plans, "records": d.records, "effects": d.effects,
                             **kw})  # type: ignore[arg-type]


def test_a_clean_durable_history_passes() -> None:
    h = durable_history()
    assert failed(h) == set()
    # A body run again before its record (its run ended first) is the at-least-once asked.
    h.events = [Event(41, 1, "r0", 99, "start", at(-1.1)),
                Event(41, 1, "r0", 99, "body:step-0", at(-1.0)), *h.events]
    assert failed(h) == set()
    assert "1 ran again before their record" in next(
        r.detail for r in check.check(h) if r.name == BODIES)


def test_a_transaction_step_effect_missing_doubled_or_unrecorded_fails() -> None:
    effects = durable_history().durable.effects
    assert EFFECTS in failed(durable_history(durable=with_durable(effects=effects[:1])))
    doubled = [*effects, StepEffect(41, "pay-1", "r2")]
    assert EFFECTS in failed(durable_history(durable=with_durable(effects=doubled)))
    # Committed by another run than the one that recorded it.
    other = [effects[0], StepEffect(41, "pay-1", "r1")]
    assert EFFECTS in failed(durable_history(durable=with_durable(effects=other)))
    # An effect without its record, and a complete job without a transaction step's record.
    records = [r for r in durable_history().durable.records if r.name != "pay-1"]
    assert EFFECTS in failed(durable_history(durable=with_durable(records=records)))
    assert EFFECTS in failed(durable_history(durable=with_durable(
        records=records, effects=effects[:1])))


def test_a_step_body_run_after_its_record_fails() -> None:
    late = [*durable_history().events, Event(41, 1, "r2", 100, "body:step-0", at(2.15))]
    result = {r.name: r for r in check.check(durable_history(events=late))}[BODIES]
    assert not result.ok and "after its record" in result.examples[0]
    # A record written by a run whose body never ran.
    records = [StepRecord(41, "step-0", "step", "r2", 1, at(0.2)),
               *durable_history().durable.records[1:]]
    assert BODIES in failed(durable_history(durable=with_durable(records=records)))


def test_a_durable_job_unfinished_or_awake_too_early_fails() -> None:
    early = [e if e.event != "woke" else Event(41, 1, "r2", 100, "woke", at(1.4))
             for e in durable_history().events]
    assert DURABLE in failed(durable_history(events=early))
    records = [r for r in durable_history().durable.records if r.name != "step-1"]
    assert DURABLE in failed(durable_history(durable=with_durable(records=records)))
    for row in (JobRow(41, "chaos.Durable", "dead", 2, 13, False),
                JobRow(41, "chaos.Durable", "cancelled", 1, 13, False),
                JobRow(41, "chaos.Durable", "available", 1, 13, False)):
        assert DURABLE in failed(durable_history(jobs=[row], effects={}))
    assert DURABLE not in failed(durable_history(
        jobs=[JobRow(41, "chaos.Durable", "cancelled", 1, 13, False)], effects={},
        cancelled={41}))
    bad = [*durable_history().events, Event(41, 1, "r2", 100, "bad-value", at(2.35))]
    assert DURABLE in failed(durable_history(events=bad))


EVENTS = "every event consumed once"
JOINS = "every join saw all its children"
SPAWNS = "no child spawned twice"


def waits_history(**kw: object) -> History:
    """chaos.Waiter job 51: run w1 finds "first" sent already, then suspends at "second"; run
    w2 gets "first" back from its record and receives "second". chaos.Fan job 61 spawns
    leaves 62 and 63 in run f1, which suspends at its join; run f2 gets both ids back from
    their records, joins and returns their values (each leaf's own id)."""
    ev = [(51, "w1", "start", 0.0), (51, "w1", "wait:on-first", 0.1),
          (51, "w1", "got:on-first:n1", 0.2), (51, "w1", "wait:on-second", 0.3),
          (51, "w1", "suspend", 0.4), (51, "w2", "start", 2.0),
          (51, "w2", "wait:on-first", 2.1), (51, "w2", "got:on-first:n1", 2.2),
          (51, "w2", "wait:on-second", 2.3), (51, "w2", "got:on-second:n2", 2.4),
          (51, "w2", "end", 2.5), (61, "f1", "start", 0.0), (61, "f1", "spawned:leaf-0:62", 0.1),
          (61, "f1", "spawned:leaf-1:63", 0.2), (61, "f1", "suspend", 0.3),
          (61, "f2", "start", 3.0), (61, "f2", "spawned:leaf-0:62", 3.1),
          (61, "f2", "spawned:leaf-1:63", 3.2), (61, "f2", "end", 3.3)]
    events = [Event(job, 1, run, 100, name, at(t)) for job, run, name, t in ev]
    events += run_events(62, 1, "l2", 0.5, 0.6) + run_events(63, 1, "l3", 0.7, 0.8)
    base: dict[str, object] = {
        "jobs": [JobRow(51, "chaos.Waiter", "complete", 1, 13, False),
                 JobRow(61, "chaos.Fan", "complete", 1, 13, False),
                 JobRow(62, "chaos.Leaf", "complete", 1, 13, False, parent_id=61),
                 JobRow(63, "chaos.Leaf", "complete", 1, 13, False, parent_id=61)],
        "events": events, "effects": {51: 1, 61: 1, 62: 1, 63: 1}, "cancelled": set(),
        "supervisors": [SupervisorFate("s0", killed=False, alive_at_end=True, stop_code=0)],
        "waits": WaitHistory(
            waiters={51}, fans={61: 2},
            sent=[Sent(51, "first", "n1", 1), Sent(51, "second", "n2", 2)],
            rows=[EventRow(1, 51, "first", "n1", True, "on-first"),
                  EventRow(2, 51, "second", "n2", True, "on-second")],
            waits=[WaitRecord(51, "on-first", "first", "n1", True),
                   WaitRecord(51, "on-second", "second", "n2", True)],
            spawns=[SpawnRecord(61, "leaf-0", 62), SpawnRecord(61, "leaf-1", 63)],
            joins={61: [62, 63]},
            results={61: {"values": [62, 63], "sum": 125}, 62: 62, 63: 63}),
    }
    base.update(kw)
    return History(**base)  # type: ignore[arg-type]


def with_waits(**kw: object) -> WaitHistory:
    return replace(waits_history().waits, **kw)  # type: ignore[arg-type]


def examples(h: History, name: str) -> tuple[str, ...]:
    result = {r.name: r for r in check.check(h)}[name]
    assert not result.ok
    return result.examples


def test_a_clean_waits_history_passes() -> None:
    h = waits_history()
    assert failed(h) == set()
    detail = {r.name: r.detail for r in check.check(h)}[EVENTS]
    assert "2 consumed once" in detail and "1 found their event sent, 1 suspended" in detail
    # A waiter cancelled before its second event: that one refused, nothing else asked.
    h = waits_history(jobs=[JobRow(51, "chaos.Waiter", "cancelled", 1, 13, False),
                            *waits_history().jobs[1:]], cancelled={51}, waits=with_waits(
        sent=[Sent(51, "first", "n1", 1), Sent(51, "second", "n2", None)],
        rows=waits_history().waits.rows[:1], waits=waits_history().waits.waits[:1]),
        events=[e for e in waits_history().events if e.run != "w2"])
    assert failed(h) == set()


def test_an_event_lost_doubled_or_never_sent_fails() -> None:
    w = waits_history().waits
    # A completed waiter whose second event was never consumed (nor its wait delivered).
    lost = with_waits(rows=[w.rows[0], EventRow(2, 51, "second", "n2", False)],
                      waits=[w.waits[0], WaitRecord(51, "on-second", "second", None, False)])
    found = examples(waits_history(waits=lost), EVENTS)
    assert any("job 51 complete, its event second (id 2) never consumed" in x for x in found)
    # One event delivered to both waits: the second holds the first's payload.
    twice = with_waits(waits=[w.waits[0], WaitRecord(51, "on-second", "second", "n1", True)])
    found = examples(waits_history(waits=twice), EVENTS)
    assert any("job 51: event first (id 1) consumed by on-first, its payload held by wait(s) "
               "on-first, on-second" in x for x in found)
    # An event stored twice (the run sent it again), one refused to a job that completed,
    # an id that is not the event sent.
    again = with_waits(rows=[*w.rows, EventRow(3, 51, "second", "n2", False)])
    assert "job 51: event second (id 3) stored, never sent by the run" in examples(
        waits_history(waits=again), EVENTS)
    refused = with_waits(sent=[w.sent[0], Sent(51, "second", "n2", None)])
    assert EVENTS in failed(waits_history(waits=refused))
    other = with_waits(sent=[w.sent[0], Sent(51, "second", "n2", 1)])
    assert EVENTS in failed(waits_history(waits=other))


def test_a_wait_that_got_what_was_not_sent_or_not_recorded_fails() -> None:
    w = waits_history().waits
    # A wait's record holding a payload the run never sent (nor consumed from the table).
    forged = with_waits(waits=[w.waits[0], WaitRecord(51, "on-second", "second", "zz", True)])
    assert any("wait on-second holds payload zz" in x
               for x in examples(waits_history(waits=forged), EVENTS))
    # A run that received another payload than its wait recorded: delivered twice.
    events = [e if e.event != "got:on-first:n1" or e.run != "w2"
              else Event(51, 1, "w2", 100, "got:on-first:n3", e.at)
              for e in waits_history().events]
    assert any("run w2 received n3 at wait on-first, whose record holds n1" in x
               for x in examples(waits_history(events=events), EVENTS))


def test_a_join_that_missed_a_child_or_returned_another_value_fails() -> None:
    w = waits_history().waits
    jobs = waits_history().jobs
    dead = [*jobs[:3], JobRow(63, "chaos.Leaf", "dead", 13, 13, False, parent_id=61)]
    assert "job 61 complete, its child(ren) 63 dead" in examples(
        waits_history(jobs=dead, effects={51: 1, 61: 1, 62: 1}), JOINS)
    assert any(x.startswith("job 61: its join lists [62]") for x in examples(
        waits_history(waits=with_waits(joins={61: [62]})), JOINS))
    wrong = with_waits(results={**w.results, 61: {"values": [62, 62], "sum": 124}})
    assert any(x.startswith("job 61 returned") for x in examples(waits_history(waits=wrong),
                                                                JOINS))
    # Fewer children than planned, and no join recorded at all.
    assert JOINS in failed(waits_history(waits=with_waits(fans={61: 3})))
    assert "job 61 complete, no join recorded" in examples(
        waits_history(waits=with_waits(joins={})), JOINS)


def test_a_child_spawned_twice_fails() -> None:
    w = waits_history().waits
    # A third child of 61 that none of its spawn records names: a spawn ran twice.
    extra = [*waits_history().jobs, JobRow(64, "chaos.Leaf", "complete", 1, 13, False,
                                           parent_id=61)]
    found = examples(waits_history(jobs=extra, effects={51: 1, 61: 1, 62: 1, 63: 1, 64: 1}),
                     SPAWNS)
    assert "job 61: 3 children, 2 spawn records" in found
    assert "job 61: child 64 named by none of its spawn records (spawned twice?)" in found
    # A record naming a job that is not a child; two records naming one child.
    elsewhere = with_waits(spawns=[w.spawns[0], SpawnRecord(61, "leaf-1", 51)])
    assert "job 61: spawn leaf-1 records job 51, not a child of it" in examples(
        waits_history(waits=elsewhere), SPAWNS)
    same = with_waits(spawns=[*w.spawns, SpawnRecord(61, "leaf-2", 63)])
    assert "job 61: job 63 recorded by more than one spawn" in examples(
        waits_history(waits=same), SPAWNS)
    # A run that got another id back than its spawn recorded.
    events = [e if e.event != "spawned:leaf-1:63" or e.run != "f2"
              else Event(61, 1, "f2", 100, "spawned:leaf-1:65", e.at)
              for e in waits_history().events]
    assert any("run f2 got job 65 from spawn leaf-1, whose record holds 63" in x
               for x in examples(waits_history(events=events), SPAWNS))


def test_a_child_cancelled_with_its_parent_was_asked() -> None:
    jobs = [waits_history().jobs[0], JobRow(61, "chaos.Fan", "cancelled", 1, 13, False),
            JobRow(62, "chaos.Leaf", "cancelled", 1, 13, False, parent_id=61),
            waits_history().jobs[3]]
    h = waits_history(jobs=jobs, effects={51: 1, 63: 1}, cancelled={61}, cancel_accepted={61})
    assert failed(h) == set()
    h.cancelled = {62}
    h.cancel_accepted = set()
    assert "job 61 cancelled, never asked (nor of a parent)" in examples(
        h, "cancelled if and only if a cancel was accepted")


@pytest.mark.timeout(420)
def test_a_minute_of_chaos_keeps_every_promise() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "--minutes", "1", "--supervisors", "2", "--seed", "7"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-6000:]}"
    assert "FAIL" not in proc.stdout
