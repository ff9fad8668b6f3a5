"""The durable job of the chaos run (``chaos.Durable``, issue 34): its arguments, what the
run reads of it, and its three checks.

Its handler (chaos/app.py) runs ``rounds`` rounds of a plain step ``step-<r>`` and a
transaction step ``pay-<r>``, with a durable sleep ``nap`` after round ``nap_after``. The
history it leaves, beside the events every handler records (its executions named by the
claim's run id, so that they match ``atlantis.job_steps.run_id``):

- ``body:step-<r>`` in ``chaos_history``, written by the plain step's body on the history's
  own autocommit connection before the body returns (so before the step's record);
- a row of ``chaos_step_effects`` per transaction step, written in the step's transaction
  (which commits it with the record and the lease's fence, or not at all);
- ``suspend`` when a run ends at the sleep, ``woke`` once a run is past it, ``bad-value``
  when a step returned something other than what its body returned;
- atlantis's own records, ``atlantis.job_steps`` (name, kind, run id, ``recorded_at``; a
  sleep's wake time).

The promises (``ctx.run_step``, ``ctx.transaction``, ``ctx.sleep``):

- every transaction step's effect is there exactly once: one row for each recorded
  transaction step, written by the run that recorded it, none without a record, and a
  completed job has recorded every one;
- no step body runs again once its record is written: every body of a recorded step ran
  before ``recorded_at`` by PostgreSQL's clock, and the recording run's own body is among
  them (a body may run more than once *before* its record: a run that ends between the
  body's return and the record runs it again, the at-least-once the docs state);
- each durable job ends ``complete`` (with every step recorded), ``dead`` only after all
  its attempts, or ``cancelled`` only if a cancel was asked; no run goes past the sleep
  before its recorded wake time, a completed job went past it, and every step returned its
  body's value.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from chaos.check import Event, History, Result

DURABLE = "chaos.Durable"
BODY = "body:"
"""The prefix of a plain step's body event: ``body:<step>``."""


@dataclass(frozen=True)
class Plan:
    """What one durable job runs (its args)."""

    rounds: int
    nap_after: int

    def names(self) -> list[str]:
        """Every step the handler reaches on a run that completes."""
        steps = [n for r in range(self.rounds) for n in (f"step-{r}", f"pay-{r}")]
        return [*steps, "nap"]

    def after_nap(self) -> set[str]:
        return {n for r in range(self.nap_after + 1, self.rounds)
                for n in (f"step-{r}", f"pay-{r}")}


@dataclass(frozen=True)
class StepRecord:
    """One row of ``atlantis.job_steps``."""

    job_id: int
    name: str
    kind: str
    run: str
    attempt: int
    recorded_at: datetime
    wake: datetime | None = None
    """A sleep's wake time."""


@dataclass(frozen=True)
class StepEffect:
    """One row of ``chaos_step_effects``."""

    job_id: int
    step: str
    run: str


@dataclass
class DurableHistory:
    plans: dict[int, Plan] = field(default_factory=dict)
    """Job id of each ``chaos.Durable`` row -> its plan."""
    records: list[StepRecord] = field(default_factory=list)
    effects: list[StepEffect] = field(default_factory=list)


def args(rng: random.Random) -> dict[str, Any]:
    """Two to four rounds with the sleep (0.5-2 s) between two of them; bodies (and the
    time each transaction stays open) of 10-80 ms, 30% of them 0.3-0.8 s, so that faults
    land inside bodies and transactions; 10% fail their first attempt after the first
    round."""
    rounds = rng.randint(2, 4)
    tick = rng.randint(300, 800) if rng.random() < 0.3 else rng.randint(10, 80)
    return {"rounds": rounds, "nap_after": rng.randint(0, rounds - 2),
            "nap_ms": rng.randint(500, 2000), "tick_ms": tick,
            "fail": "first" if rng.random() < 0.1 else "never"}


def read(conn: psycopg.Connection[Any]) -> DurableHistory:
    plans = {int(r[0]): Plan(int(r[1]), int(r[2])) for r in conn.execute(
        "SELECT id, (args->>'rounds')::int, (args->>'nap_after')::int FROM atlantis.jobs "
        " WHERE job = %s", (DURABLE,)).fetchall()}
    records = [StepRecord(*r) for r in conn.execute(
        "SELECT s.job_id, s.name, s.kind, s.run_id::text, s.attempt, s.recorded_at, "
        "       CASE WHEN s.kind = 'sleep' THEN (s.value->>'until')::timestamptz END "
        "  FROM atlantis.job_steps s JOIN atlantis.jobs j ON j.id = s.job_id "
        " WHERE j.job = %s ORDER BY s.job_id, s.recorded_at", (DURABLE,)).fetchall()]
    effects = [StepEffect(*r) for r in conn.execute(
        "SELECT job_id, step, run FROM chaos_step_effects ORDER BY id").fetchall()]
    return DurableHistory(plans, records, effects)


def _at(t: datetime) -> str:
    return t.isoformat(timespec="microseconds")


def _result(name: str, bad: list[str], detail: str) -> Result:
    from chaos.check import EXAMPLES, Result  # chaos.check imports this module

    return Result(name, not bad, detail, tuple(bad[:EXAMPLES]))


def check_transaction_effects(h: History) -> Result:
    d = h.durable
    recorded = {(r.job_id, r.name): r for r in d.records if r.kind == "transaction"}
    written: dict[tuple[int, str], list[str]] = defaultdict(list)
    for e in d.effects:
        written[(e.job_id, e.step)].append(e.run)
    bad: list[str] = []
    once = missing = doubled = 0
    for (job, name), r in sorted(recorded.items()):
        runs = written.get((job, name), [])
        if len(runs) == 1 and runs[0] == r.run:
            once += 1
            continue
        missing += not runs
        doubled += len(runs) > 1
        bad.append(f"job {job} {name}: recorded by run {r.run} (attempt {r.attempt}), "
                   f"its effect written {len(runs)} times, by run(s) {', '.join(runs) or '-'}")
    unrecorded = sorted(k for k in written if k not in recorded)
    bad += [f"job {job} {name}: {len(written[(job, name)])} effect(s) committed without its "
            f"record" for job, name in unrecorded]
    complete = {j.id for j in h.jobs if j.state == "complete" and j.id in d.plans}
    for job in sorted(complete):
        lost = [n for n in d.plans[job].names()
                if n.startswith("pay-") and (job, n) not in recorded]
        missing += len(lost)
        bad += [f"job {job} complete, transaction step {n} never recorded" for n in lost]
    return _result("each transaction step's effect exactly once", bad,
                   f"{len(recorded)} transaction steps recorded in "
                   f"{len({k[0] for k in recorded})} durable jobs: {once} exactly once, "
                   f"{missing} missing, {doubled} doubled, {len(unrecorded)} without a record")


def _bodies(h: History) -> dict[tuple[int, str], list[Event]]:
    ran: dict[tuple[int, str], list[Event]] = defaultdict(list)
    for e in h.events:
        if e.job_id in h.durable.plans and e.event.startswith(BODY):
            ran[(e.job_id, e.event[len(BODY):])].append(e)
    return ran


def check_bodies(h: History) -> Result:
    ran = _bodies(h)
    records = {(r.job_id, r.name): r for r in h.durable.records if r.kind == "step"}
    bad: list[str] = []
    again = 0
    for (job, name), bodies in sorted(ran.items()):
        r = records.get((job, name))
        late = [b for b in bodies if r is not None and b.at > r.recorded_at]
        again += max(0, len(bodies) - len(late) - 1)
        if r is not None:
            bad += [f"job {job} {name}: its body ran in run {b.run} (attempt {b.attempt}) at "
                    f"{_at(b.at)}, after its record at {_at(r.recorded_at)} by run {r.run} "
                    f"(attempt {r.attempt})" for b in late]
    for (job, name), r in sorted(records.items()):
        if not any(b.run == r.run and b.at <= r.recorded_at for b in ran.get((job, name), [])):
            bad.append(f"job {job} {name}: recorded by run {r.run} at {_at(r.recorded_at)}, "
                       f"whose body did not run before it")
    return _result("no step body ran again after its record", bad,
                   f"{sum(len(b) for b in ran.values())} bodies ran, {len(records)} "
                   f"recorded; {again} ran again before their record (a run ended between "
                   f"body and record), {len(bad)} wrong")


def _fates(h: History) -> list[str]:
    """Each durable job's end, explained as the job checks explain every job's."""
    bad: list[str] = []
    recorded = {(r.job_id, r.name) for r in h.durable.records}
    for j in h.jobs:
        plan = h.durable.plans.get(j.id)
        if plan is None:
            continue
        if j.state == "complete":
            lost = [n for n in plan.names() if (j.id, n) not in recorded]
            if lost:
                bad.append(f"job {j.id} complete, step(s) {', '.join(lost)} not recorded")
        elif j.state == "dead" and j.attempt != j.max_attempts:
            bad.append(f"job {j.id} dead after attempt {j.attempt}/{j.max_attempts}")
        elif j.state == "cancelled" and j.id not in h.cancelled:
            bad.append(f"job {j.id} cancelled, never asked")
        elif j.state not in ("complete", "dead", "cancelled"):
            bad.append(f"job {j.id} {j.state} attempt {j.attempt}/{j.max_attempts}")
    return bad


def _sleeps(h: History) -> list[str]:
    """No run past the sleep before its wake time; every completed job past it; every step
    returned its body's value."""
    d = h.durable
    wakes = {r.job_id: r.wake for r in d.records if r.kind == "sleep" and r.wake is not None}
    later = {j: plan.after_nap() for j, plan in d.plans.items()}
    bad: list[str] = []
    woke: set[int] = set()
    for e in h.events:
        if e.job_id not in d.plans:
            continue
        wake = wakes.get(e.job_id)
        body_after = e.event.startswith(BODY) and e.event[len(BODY):] in later[e.job_id]
        past = e.event == "woke" or body_after
        if e.event == "woke":
            woke.add(e.job_id)
        if past and (wake is None or e.at < wake):
            bad.append(f"job {e.job_id}: {e.event} at {_at(e.at)} (run {e.run}), before its "
                       f"wake time {_at(wake) if wake else '(no sleep recorded)'}")
        if e.event == "bad-value":
            bad.append(f"job {e.job_id}: a step returned another value than its body's "
                       f"(run {e.run})")
    bad += [f"job {j.id} complete, never past its sleep" for j in h.jobs
            if j.id in d.plans and j.state == "complete" and j.id not in woke]
    return bad


def check_durable_jobs(h: History) -> Result:
    bad = _fates(h) + _sleeps(h)
    states = Counter(j.state for j in h.jobs if j.id in h.durable.plans)
    suspended = sum(1 for e in h.events if e.job_id in h.durable.plans and e.event == "suspend")
    sleeps = sum(1 for r in h.durable.records if r.kind == "sleep")
    return _result("each durable job finished, its steps recorded, its sleep kept", bad,
                   f"{len(h.durable.plans)} durable jobs: {states['complete']} complete, "
                   f"{states['dead']} dead, {states['cancelled']} cancelled; {sleeps} sleeps "
                   f"recorded, {suspended} runs suspended, {len(bad)} wrong")


def checks(h: History) -> list[Result]:
    return [check_transaction_effects(h), check_bodies(h), check_durable_jobs(h)]
